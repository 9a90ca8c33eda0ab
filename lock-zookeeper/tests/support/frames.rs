//! ZooKeeper's wire frames (each a 4-byte big-endian length, then the body) and a relay hook
//! that loses the reply to a `create`: the server applies it, the client never hears of it.

use std::sync::{
    Arc,
    atomic::{AtomicBool, AtomicUsize, Ordering},
};

use conformance_tests::faults::{Flow, Hook};

/// The opcode of `create2`, the contenders' create.
const OP_CREATE2: i32 = 15;

/// Splits complete length-prefixed frames off the front of `buf`.
pub(crate) fn frames(buf: &mut Vec<u8>) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let Some(len) = buf
            .get(..4)
            .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        else {
            return out;
        };
        let total = 4 + usize::try_from(len).unwrap_or(0);
        if buf.len() < total {
            return out;
        }
        out.push(buf.drain(..total).collect());
    }
}

/// The big-endian `i32` at byte `at` of `frame`.
pub(crate) fn int_at(frame: &[u8], at: usize) -> Option<i32> {
    frame
        .get(at..at + 4)
        .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

/// When armed, a relayed connection forwards the next `create2` request and, if the server
/// applied it, closes instead of forwarding its reply. Shared by the relay's connections.
#[derive(Debug, Clone, Default)]
pub(crate) struct CreateReplyCutter {
    armed: Arc<AtomicBool>,
    cuts: Arc<AtomicUsize>,
}

impl CreateReplyCutter {
    /// Cuts the next successful `create2`'s reply.
    pub(crate) fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    /// How many replies were cut.
    pub(crate) fn cuts(&self) -> usize {
        self.cuts.load(Ordering::SeqCst)
    }

    /// The hook of one connection.
    pub(crate) fn hook(&self) -> CutReply {
        CutReply {
            cutter: self.clone(),
            from_client: Vec::new(),
            from_server: Vec::new(),
            client_started: false,
            server_started: false,
            cut_xid: None,
        }
    }
}

/// [`CreateReplyCutter`] on one connection: whole frames only pass, so a request and its
/// reply are seen whole.
#[derive(Debug)]
pub(crate) struct CutReply {
    cutter: CreateReplyCutter,
    from_client: Vec<u8>,
    from_server: Vec<u8>,
    /// The first frame each way is the connect request / response, without a header.
    client_started: bool,
    server_started: bool,
    /// The request whose reply is cut.
    cut_xid: Option<i32>,
}

impl Hook for CutReply {
    fn client_sent(&mut self, bytes: &[u8], out: &mut Vec<u8>) -> Flow {
        self.from_client.extend_from_slice(bytes);
        for frame in frames(&mut self.from_client) {
            // Request: length, xid, opcode.
            if self.client_started
                && int_at(&frame, 8) == Some(OP_CREATE2)
                && self.cutter.armed.swap(false, Ordering::SeqCst)
            {
                self.cut_xid = int_at(&frame, 4);
            }
            self.client_started = true;
            out.extend_from_slice(&frame);
        }
        Flow::Forward
    }

    fn server_sent(&mut self, bytes: &[u8], out: &mut Vec<u8>) -> Flow {
        self.from_server.extend_from_slice(bytes);
        for frame in frames(&mut self.from_server) {
            // Reply: length, xid, zxid (8 bytes), error code.
            if self.server_started && self.cut_xid.is_some() && int_at(&frame, 4) == self.cut_xid {
                if int_at(&frame, 16) == Some(0) {
                    // Applied by the server; the client never hears of it.
                    self.cutter.cuts.fetch_add(1, Ordering::SeqCst);
                    return Flow::Cut;
                }
                self.cut_xid = None;
                self.cutter.arm();
            }
            self.server_started = true;
            out.extend_from_slice(&frame);
        }
        Flow::Forward
    }
}
