//! [`MultiGuard`] and [`LockClient::acquire_all`]: several locks taken together, all or
//! nothing.
//!
//! - **Order**: the names are taken one after the other in the caller's order. Callers that
//!   may contend for overlapping sets should agree on one order (sort the names), or two of
//!   them can each hold a part the other waits for until their budgets run out.
//! - **One wait budget** for the whole set: each acquisition gets what is left of it.
//! - **All or nothing**: when one acquisition fails, the locks already taken are released
//!   (awaited) before the error is returned. A dropped `acquire_all` future drops the guards
//!   it holds, and each releases in the background, as any dropped guard does.
//! - **One loss signal**: [`MultiGuard::lost`] resolves when the first of the locks is lost.
//! - **Release** in the reverse order.

use std::time::Instant;

use futures::future::select_all;

use crate::{
    Fence, Holder, IntoLockName, LockClient, LockError, LockGuard, LockName, LockOptions,
    LossReason, guard::Lost,
};

/// Several locks held together (see [`LockClient::acquire_all`]).
#[derive(Debug)]
#[must_use = "dropping a MultiGuard releases its locks (in the background)"]
pub struct MultiGuard {
    guards: Vec<LockGuard>,
}

impl MultiGuard {
    /// The guards, in the order they were taken.
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// The fence of `name`'s lock, if it is one of the set.
    pub fn fence(&self, name: &LockName) -> Option<Fence> {
        self.guards
            .iter()
            .find(|g| g.name() == name)
            .map(LockGuard::fence)
    }

    /// Whether every lock of the set is still held.
    pub fn is_held(&self) -> bool {
        self.guards.iter().all(LockGuard::is_held)
    }

    /// Resolves when the first lock of the set is lost, with its reason (or
    /// [`LossReason::Released`] once the set is released).
    pub async fn lost(&self) -> LossReason {
        let all: Vec<Lost> = self.guards.iter().map(LockGuard::lost).collect();
        let (reason, ..) = select_all(all).await;
        reason
    }

    /// Releases every lock of the set, the last taken first. Every release is tried.
    ///
    /// # Errors
    /// The first release that failed (the others were still tried).
    pub async fn release(mut self) -> Result<(), LockError> {
        let mut first = None;
        while let Some(guard) = self.guards.pop() {
            if let Err(error) = guard.release().await {
                first.get_or_insert(error);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

impl LockClient {
    /// Acquires every one of `names` for `holder`, in order, within one wait budget
    /// (`options.wait` for the whole set), all or nothing (see the module's rules).
    ///
    /// ```
    /// use std::time::Duration;
    /// use lock_core::{Holder, LockClient, LockOptions, MemoryBackend};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_core::LockError> {
    /// let client = LockClient::new(MemoryBackend::new());
    /// let options = LockOptions::new().wait(Duration::from_millis(100));
    /// let both = client
    ///     .acquire_all(&Holder::new(), ["accounts/1", "accounts/2"], &options)
    ///     .await?;
    /// // Another holder cannot take one of them.
    /// let one = client.acquire_all(&Holder::new(), ["accounts/2"], &options).await;
    /// assert!(one.is_err());
    /// both.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] for no names or a name given twice (nothing is taken);
    /// otherwise the first acquisition's error, after the locks taken were released.
    ///
    /// # Cancel safety
    /// Dropping the future drops the guards taken so far, which release in the background.
    pub async fn acquire_all<I, N>(
        &self,
        holder: &Holder,
        names: I,
        options: &LockOptions,
    ) -> Result<MultiGuard, LockError>
    where
        I: IntoIterator<Item = N>,
        N: IntoLockName,
    {
        let names = names
            .into_iter()
            .map(IntoLockName::into_lock_name)
            .collect::<Result<Vec<LockName>, LockError>>()?;
        if names.is_empty() {
            return Err(LockError::invalid_options(
                "acquire_all needs at least one name",
            ));
        }
        for (i, name) in names.iter().enumerate() {
            if names[..i].contains(name) {
                return Err(LockError::invalid_options(format!(
                    "acquire_all names `{name}` twice"
                )));
            }
        }
        options.validate()?;
        let deadline = Instant::now() + options.wait;
        let mut taken = MultiGuard {
            guards: Vec::with_capacity(names.len()),
        };
        for name in names {
            let left = deadline.saturating_duration_since(Instant::now());
            match self
                .acquire(holder, name, &options.clone().wait(left))
                .await
            {
                Ok(guard) => taken.guards.push(guard),
                Err(error) => {
                    // All or nothing: give back what was taken (its errors are the lesser
                    // news; the locks end with their TTL at worst).
                    let _ = taken.release().await;
                    return Err(error);
                }
            }
        }
        Ok(taken)
    }

    /// [`LockClient::acquire_all`] for a new holder, with the client's options.
    ///
    /// # Errors
    /// As [`LockClient::acquire_all`].
    ///
    /// # Cancel safety
    /// As [`LockClient::acquire_all`].
    pub async fn lock_all<I, N>(&self, names: I) -> Result<MultiGuard, LockError>
    where
        I: IntoIterator<Item = N>,
        N: IntoLockName,
    {
        let options = self.options().clone();
        self.acquire_all(&Holder::new(), names, &options).await
    }
}
