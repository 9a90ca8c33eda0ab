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

/// `SERVER_MORE_RESULTS_EXISTS`: an OK packet's status flag saying more results of the same
/// batch follow.
const MORE_RESULTS: u16 = 0x0008;

/// Splits the complete packets off the front of `buffer` (a 3-byte little-endian payload
/// length, a sequence number, the payload), leaving a partial one in it.
pub fn packets(buffer: &mut Vec<u8>) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while buffer.len() >= 4 {
        let len =
            usize::from(buffer[0]) | usize::from(buffer[1]) << 8 | usize::from(buffer[2]) << 16;
        if buffer.len() < 4 + len {
            break;
        }
        out.push(buffer.drain(..4 + len).collect());
    }
    out
}

/// For an OK packet (header included): whether its status says more results follow; `None`
/// for any other packet.
pub fn ok_says_more(packet: &[u8]) -> Option<bool> {
    let payload = packet.get(4..)?;
    if payload.first() != Some(&0x00) {
        return None;
    }
    // Header byte, then affected rows and last insert id (length-encoded), then the status.
    let mut at = 1;
    for _ in 0..2 {
        at += match payload.get(at)? {
            0xfc => 3,
            0xfd => 4,
            0xfe => 9,
            _ => 1,
        };
    }
    let status = u16::from_le_bytes([*payload.get(at)?, *payload.get(at + 1)?]);
    Some(status & MORE_RESULTS != 0)
}
