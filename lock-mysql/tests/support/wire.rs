//! The commands in what a MySQL client sends: the protocol's packets (a 3-byte little-endian
//! length, a sequence number, the payload), of which a command is the first of an exchange.

/// `COM_QUERY`: a statement's text.
const COM_QUERY: u8 = 0x03;
/// `COM_STMT_PREPARE`: a statement's text, to prepare.
const COM_STMT_PREPARE: u8 = 0x16;
/// `COM_STMT_EXECUTE`: a prepared statement's id and its bound parameter values.
const COM_STMT_EXECUTE: u8 = 0x17;

/// The commands in `bytes`, everything one connection's client sent: statement texts
/// (`COM_QUERY`, `COM_STMT_PREPARE`) go to `texts`, the payloads of `COM_STMT_EXECUTE` (which
/// carry the bound parameter values) to `executes`.
pub fn commands(bytes: &[u8], texts: &mut Vec<String>, executes: &mut Vec<Vec<u8>>) {
    let mut at = 0;
    while at + 4 <= bytes.len() {
        let len = usize::from(bytes[at])
            | usize::from(bytes[at + 1]) << 8
            | usize::from(bytes[at + 2]) << 16;
        let seq = bytes[at + 3];
        let payload = &bytes[(at + 4).min(bytes.len())..(at + 4 + len).min(bytes.len())];
        if seq == 0 {
            match payload.first() {
                Some(&(COM_QUERY | COM_STMT_PREPARE)) => {
                    texts.push(String::from_utf8_lossy(&payload[1..]).into_owned());
                }
                Some(&COM_STMT_EXECUTE) => executes.push(payload[1..].to_vec()),
                _ => {}
            }
        }
        at += 4 + len;
    }
}
