//! A batch of operations as an owner sends it to its replicas.
//!
//! The same batch goes to every replica (two with the default three
//! copies), each over its own link. Sent as one shared value, it is
//! encoded for the wire once: the first link to send it encodes it, and
//! the others send the same chunks. Before, each replica got a clone of
//! the operations (an allocation per client id and filter) and each link
//! encoded its own: together about a tenth of an owner's event loop in a
//! profile of replicated persistent QoS 1 (BENCHMARKS.md).

use super::ReplOp;
use crate::core::peer_wire::WireError;
use bytes::Bytes;
use std::sync::{Arc, OnceLock};

/// Operations on persistent sessions, oldest first, shared by the
/// `PeerEvent::Replicate`s of one owner event.
#[derive(Clone, Debug)]
pub struct ReplBatch(Arc<Shared>);

#[derive(Debug)]
struct Shared {
    ops: Vec<ReplOp>,
    /// The wire form of `ops` (see `replica_wire::encode`), made by the
    /// first link that sends the batch.
    wire: OnceLock<Result<Vec<Bytes>, WireError>>,
}

impl ReplBatch {
    /// A batch of `ops`, not encoded yet.
    pub fn new(ops: Vec<ReplOp>) -> Self {
        Self(Arc::new(Shared {
            ops,
            wire: OnceLock::new(),
        }))
    }

    /// The operations to apply: moved out when this is the last holder
    /// (a batch read from a link always is), cloned otherwise.
    pub fn into_ops(self) -> Vec<ReplOp> {
        match Arc::try_unwrap(self.0) {
            Ok(shared) => shared.ops,
            Err(shared) => shared.ops.clone(),
        }
    }

    /// The operations' wire chunks, encoded on the first call.
    pub(crate) fn wire(&self) -> Result<&[Bytes], WireError> {
        self.0
            .wire
            .get_or_init(|| {
                // A header and a payload per message at most, and the rest.
                let mut parts = Vec::with_capacity(self.0.ops.len() * 2 + 1);
                super::super::replica_wire::encode(&self.0.ops, &mut parts).map(|()| parts)
            })
            .as_ref()
            .map(Vec::as_slice)
            .map_err(Clone::clone)
    }
}

impl From<Vec<ReplOp>> for ReplBatch {
    fn from(ops: Vec<ReplOp>) -> Self {
        Self::new(ops)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drop_op(c: &str) -> ReplOp {
        ReplOp::Drop { client: c.into() }
    }

    #[test]
    fn a_shared_batch_is_encoded_once_and_its_last_holder_takes_the_ops() {
        let b = ReplBatch::new(vec![drop_op("a"), drop_op("b")]);
        let other = b.clone();
        let first = b.wire().map(<[Bytes]>::to_vec);
        let again = other.wire().map(<[Bytes]>::to_vec);
        assert!(first.as_ref().is_ok_and(|p| !p.is_empty()));
        // The same chunks, not an equal encoding made again.
        let (Ok(first), Ok(again)) = (first, again) else {
            panic!("not encoded");
        };
        assert_eq!(first.len(), again.len());
        for (x, y) in first.iter().zip(&again) {
            assert_eq!(x.as_ptr(), y.as_ptr());
        }
        assert_eq!(b.into_ops(), [drop_op("a"), drop_op("b")], "cloned");
        assert_eq!(other.into_ops(), [drop_op("a"), drop_op("b")], "moved");
    }
}
