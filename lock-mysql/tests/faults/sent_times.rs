//! What in a statement, or in the bound values of one, is a time the client computed: the
//! checker behind `clock/client_sends_no_time`. Every expiry must be the server's own
//! `NOW(6) + INTERVAL <ttl>`, every comparison against the server's `NOW(6)`.

use std::time::SystemTime;

/// Current time in seconds, milliseconds, microseconds and nanoseconds, each with a day's
/// window around it.
pub(super) fn now_windows() -> [(u128, u128); 4] {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let day = 86_400u128;
    [
        (now.as_secs().into(), day),
        (now.as_millis(), day * 1_000),
        (now.as_micros(), day * 1_000_000),
        (now.as_nanos(), day * 1_000_000_000),
    ]
}

/// Why the bound parameters of one `COM_STMT_EXECUTE` carry a time, if they do: any 4- or
/// 8-byte little-endian integer near the current time, or a date written as text.
pub(super) fn client_time_in_parameters(payload: &[u8]) -> Option<String> {
    let near = now_windows();
    for width in [4usize, 8] {
        for window in payload.windows(width) {
            let mut value = 0u128;
            for (i, b) in window.iter().enumerate() {
                value |= u128::from(*b) << (8 * i);
            }
            if near.iter().any(|(t, w)| value.abs_diff(*t) <= *w) {
                return Some(format!(
                    "a bound {width}-byte integer {value}, a time near now"
                ));
            }
        }
    }
    date_literal(payload).then(|| "a date written as text".to_owned())
}

/// Whether `bytes` contain `dddd-dd-dd`.
pub(super) fn date_literal(bytes: &[u8]) -> bool {
    bytes.windows(10).any(|w| {
        let d = |i: usize| w[i].is_ascii_digit();
        d(0) && d(1) && d(2) && d(3) && w[4] == b'-' && d(5) && d(6) && w[7] == b'-' && d(8) && d(9)
    })
}

/// Whether `operand` (upper case, what follows `column =` or a comparison) is a time the
/// server computes: `NOW(6)`, `NOW(6) + INTERVAL <ttl> MICROSECOND` (spliced or bound),
/// `NULL`, the column itself, or an `IF(condition, a, b)` of such.
pub(super) fn server_time(operand: &str, column: &str, ttls_us: &[u64]) -> bool {
    if let Some(rest) = operand.strip_prefix("IF(") {
        let args = top_level_args(rest);
        return args.len() == 3
            && server_time(args[1], column, ttls_us)
            && server_time(args[2], column, ttls_us);
    }
    // A lease handed to the next waiter lasts that waiter's turn: a duration it stored in
    // its place (`turn_us`), read into `@lm_turn` on the server.
    let with_ttl = operand.starts_with("NOW(6) + INTERVAL ? MICROSECOND")
        || operand.starts_with("NOW(6) + INTERVAL @LM_TURN MICROSECOND")
        || ttls_us
            .iter()
            .any(|us| operand.starts_with(&format!("NOW(6) + INTERVAL {us} MICROSECOND")));
    let plain_now = operand.starts_with("NOW(6)")
        && !operand.starts_with("NOW(6) +")
        && !operand.starts_with("NOW(6) -");
    let itself = operand.strip_prefix(column).is_some_and(|rest| {
        rest.trim_start().is_empty() || rest.trim_start().starts_with([',', ')'])
    });
    with_ttl || plain_now || itself || operand.starts_with("NULL")
}

/// The comma-separated arguments of a call whose opening parenthesis precedes `rest`.
pub(super) fn top_level_args(rest: &str) -> Vec<&str> {
    let (mut depth, mut start, mut args) = (0usize, 0, Vec::new());
    for (i, c) in rest.char_indices() {
        match c {
            '(' => depth += 1,
            ')' if depth == 0 => {
                args.push(rest[start..i].trim());
                return args;
            }
            ')' => depth -= 1,
            ',' if depth == 0 => {
                args.push(rest[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    args
}

/// Why `sql` carries a time the client computed, if it does.
pub(super) fn client_time_in(sql: &str, ttls_us: &[u64]) -> Option<String> {
    let upper = sql.to_ascii_uppercase();
    for function in [
        "CURRENT_TIMESTAMP",
        "SYSDATE",
        "UTC_TIMESTAMP",
        "FROM_UNIXTIME",
        "CURDATE",
        "CURTIME",
        "LOCALTIME",
        "TIMESTAMP =",
        "@@TIMESTAMP",
        "SET TIMESTAMP",
    ] {
        if upper.contains(function) {
            return Some(format!("uses {function}"));
        }
    }
    for (i, _) in upper.match_indices("UNIX_TIMESTAMP(") {
        if !upper[i..].starts_with("UNIX_TIMESTAMP(EXPIRES_AT)") {
            return Some("converts something other than the stored expiry to epoch time".into());
        }
    }
    // Every comparison or assignment of a time column is against NOW(6) or NULL.
    for column in ["EXPIRES_AT", "ACQUIRED_AT"] {
        for (i, _) in upper.match_indices(column) {
            let rest = upper[i + column.len()..].trim_start();
            let operand = ["<=", ">=", "=", "<", ">"]
                .iter()
                .find_map(|op| rest.strip_prefix(op))
                .map(str::trim_start);
            if let Some(operand) = operand
                && !server_time(operand, column, ttls_us)
            {
                return Some(format!("sets or compares {column} with {operand:.40}"));
            }
        }
    }
    // No date literal and no number near the current time in s, ms, µs or ns.
    if date_literal(sql.as_bytes()) {
        return Some("contains a date literal".into());
    }
    let near = now_windows();
    let mut in_hex = false;
    let mut number = String::new();
    let mut prev = ' ';
    for c in sql.chars().chain(std::iter::once(' ')) {
        if !in_hex && c == '\'' && prev == 'X' {
            in_hex = true;
        } else if in_hex && c == '\'' {
            in_hex = false;
        } else if !in_hex
            && c.is_ascii_digit()
            && (!number.is_empty() || !prev.is_ascii_alphanumeric())
        {
            number.push(c);
        } else {
            if let Ok(n) = number.parse::<u128>()
                && near.iter().any(|(t, window)| n.abs_diff(*t) <= *window)
            {
                return Some(format!("contains the number {n}, a time near now"));
            }
            number.clear();
        }
        prev = c;
    }
    None
}
