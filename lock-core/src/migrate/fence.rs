//! The fence of a migrating lock: `generation << 53 | store fence`.

use crate::{Fence, LockError};

/// Bits of a store's own fence.
pub const STORE_BITS: u32 = 53;

/// The largest generation (the bits left above the store's fence).
pub const MAX_GENERATION: u64 = (1 << (64 - STORE_BITS)) - 1;

/// `generation << 53 | store`: above every fence of a lower generation.
///
/// ```
/// use lock_core::{Fence, migrate::fence};
///
/// let before = fence::encode(0, Fence::new(1_800_000_000_000_000))?; // a Redis hybrid clock
/// let after = fence::encode(1, Fence::new(7))?;                      // a fresh counter
/// assert!(after > before);
/// # Ok::<(), lock_core::LockError>(())
/// ```
///
/// # Errors
/// [`LockError::Backend`] when the store's fence does not fit in 53 bits, or the generation
/// in the 11 above them.
pub fn encode(generation: u64, store: Fence) -> Result<Fence, LockError> {
    if store.get() >> STORE_BITS != 0 {
        return Err(LockError::backend_msg(format!(
            "fence {} does not fit the 53 bits a migrating lock leaves the store",
            store.get()
        )));
    }
    if generation > MAX_GENERATION {
        return Err(LockError::backend_msg(format!(
            "migration generation {generation} is above {MAX_GENERATION}"
        )));
    }
    Ok(Fence::new(generation << STORE_BITS | store.get()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations_order_fences_and_overflow_is_typed() {
        let high = encode(2, Fence::new((1 << 53) - 1)).unwrap();
        let low = encode(3, Fence::new(1)).unwrap();
        assert!(low > high);
        assert_eq!(encode(0, Fence::new(42)).unwrap(), Fence::new(42));
        assert!(encode(0, Fence::new(1 << 53)).is_err());
        assert!(encode(MAX_GENERATION + 1, Fence::new(1)).is_err());
    }
}
