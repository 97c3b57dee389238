//! A batch of operations as an owner sends it to its replicas.
//!
//! The same batch goes to every replica (two with the default three
//! copies), each over its own link. Sent as one shared value, it is
//! encoded for the wire once: the first link to send it encodes it, and
//! the others send the same chunks. Before, each replica got a clone of
//! the operations (an allocation per client id and filter) and each link
//! encoded its own: together about a tenth of an owner's event loop in a
//! profile of replicated persistent QoS 1 (BENCHMARKS.md).
//!
//! Full images (a replica new to the set, or back) go as several batches
//! ([`image_batches`]): one batch of every session's image could pass a
//! link frame's limit, and was then not sent at all. Any other batch
//! past [`IMAGE_SPLIT`] goes in parts, joined again before it is applied
//! ([`frame_parts`]).

use super::ReplOp;
use crate::core::peer_wire::WireError;
use bytes::Bytes;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock};
use zerofan_store::MsgId;

/// Bytes of operations past which a batch of full images takes no further
/// session: the next starts a batch of its own. Far below a link frame's
/// limit (`peer_wire::MAX_FRAME`), and a replica applies what a node holds
/// in steps, not in one event.
pub(crate) const IMAGE_BATCH: usize = 8 << 20;

/// Bytes of operations past which one session's image is split too,
/// before a message. Below it an image stays whole in one batch: a
/// replica given only its first part (its owner dying in between) would
/// hold less than the copy it had. Above it, whole, it could pass a link
/// frame's limit (a queue of `max_queued_bytes` above 256 MiB).
pub(crate) const IMAGE_SPLIT: usize = 64 << 20;

/// `ops` (full images, as `Broker::send_images` makes them) as batches to
/// send in order: a new one before a session's image once a batch holds
/// [`IMAGE_BATCH`] bytes, and before a message once it holds
/// [`IMAGE_SPLIT`]. A queue entry whose message went in an earlier batch
/// gets the message again in its own, so that each batch names every
/// message it references (a replica forgets one that no entry of its
/// batch references, and keeps one it holds already without a second
/// count). Parts of an image after the first carry no epoch: a change
/// naming none applies to the copy its sender owns (`Fence::judge`), and
/// a second epoch at the same version would make the replica skip them
/// as had.
pub(crate) fn image_batches(ops: Vec<ReplOp>) -> Vec<Vec<ReplOp>> {
    image_batches_at(ops, IMAGE_BATCH, IMAGE_SPLIT)
}

fn image_batches_at(ops: Vec<ReplOp>, batch: usize, split: usize) -> Vec<Vec<ReplOp>> {
    let mut out = Vec::new();
    let mut cur: Vec<ReplOp> = Vec::new();
    let mut bytes = 0usize;
    let mut known: HashMap<MsgId, ReplOp> = HashMap::new();
    let mut here: HashSet<MsgId> = HashSet::new();
    for op in ops {
        // An image starts with its epoch, or with its reset when it has
        // none: never between the two.
        let starts = match &op {
            ReplOp::Epoch { .. } => true,
            ReplOp::Reset { .. } => !matches!(cur.last(), Some(ReplOp::Epoch { .. })),
            _ => false,
        };
        // Never between a message and the entry after it that needs it.
        let data = match &op {
            ReplOp::Message { .. } => true,
            ReplOp::Enqueue { item, .. } => !here.contains(&item.msg),
            _ => false,
        };
        if !cur.is_empty() && ((starts && bytes >= batch) || (data && bytes >= split)) {
            out.push(std::mem::take(&mut cur));
            bytes = 0;
            here.clear();
        }
        match &op {
            ReplOp::Message { id, .. } => {
                known.insert(*id, op.clone());
                here.insert(*id);
            }
            ReplOp::Enqueue { item, .. } if !here.contains(&item.msg) => {
                if let Some(m) = known.get(&item.msg) {
                    bytes += m.size();
                    here.insert(item.msg);
                    cur.push(m.clone());
                }
            }
            _ => {}
        }
        bytes += op.size();
        cur.push(op);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// `ops`, a batch larger than [`IMAGE_SPLIT`], as parts to send in
/// order, each of at most that (or of one operation) and led by its
/// `ReplOp::Part`. Unlike [`image_batches`], the cuts fall anywhere: the
/// receiver joins the parts and applies them as the one batch they were
/// (see `parts`). That is what a copy sent to a claimant needs (judged as
/// a whole against the claimant's own, `previous`), and what the batch
/// of a session a new owner installs from a copy needs (its records in
/// one event, acknowledged together).
pub(crate) fn frame_parts(ops: Vec<ReplOp>) -> Vec<Vec<ReplOp>> {
    frame_parts_at(ops, IMAGE_SPLIT)
}

fn frame_parts_at(ops: Vec<ReplOp>, split: usize) -> Vec<Vec<ReplOp>> {
    let mut out: Vec<Vec<ReplOp>> = Vec::new();
    let mut bytes = 0usize;
    for op in ops {
        let size = op.size();
        let full = bytes > 0 && bytes + size > split;
        match out.last_mut() {
            Some(cur) if !full => cur.push(op),
            _ => {
                let index = u32::try_from(out.len()).unwrap_or(u32::MAX);
                out.push(vec![ReplOp::Part { index, last: false }, op]);
                bytes = 0;
            }
        }
        bytes += size;
    }
    if let Some(ReplOp::Part { last, .. }) = out.last_mut().and_then(|p| p.first_mut()) {
        *last = true;
    }
    out
}

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

    /// A session's image as `Broker::image_ops` makes it: its epoch (when
    /// `epoch`), reset, and an entry per message of `msgs` (each message
    /// before its first entry in `named`), the first one sent.
    fn image(c: &str, epoch: bool, msgs: &[u64], named: &mut HashSet<u64>) -> Vec<ReplOp> {
        let mut ops = Vec::new();
        if epoch {
            ops.push(ReplOp::Epoch {
                client: c.into(),
                epoch: 3,
                version: 7,
            });
        }
        ops.push(ReplOp::Reset {
            client: c.into(),
            meta: Default::default(),
            read: None,
        });
        for (i, &m) in msgs.iter().enumerate() {
            if named.insert(m) {
                ops.push(ReplOp::Message {
                    id: MsgId(m),
                    msg: Arc::new(zerofan_store::StoredMessage {
                        payload: Bytes::from(vec![0u8; 968]),
                        ..Default::default()
                    }),
                    mark: None,
                });
            }
            ops.push(ReplOp::Enqueue {
                client: c.into(),
                entry: zerofan_store::EntryId(i as u64),
                item: zerofan_store::QueueEntry {
                    msg: MsgId(m),
                    ..Default::default()
                },
            });
            if i == 0 {
                ops.push(ReplOp::Send {
                    client: c.into(),
                    entry: zerofan_store::EntryId(0),
                    pid: 1,
                });
            }
        }
        ops
    }

    /// Each batch's ops, a letter each: Epoch, Reset, Message (its id),
    /// Enqueue (its message's id), Send.
    fn shape(batches: &[Vec<ReplOp>]) -> Vec<String> {
        batches
            .iter()
            .map(|b| {
                b.iter()
                    .map(|op| match op {
                        ReplOp::Epoch { client, .. } => format!("E{client}"),
                        ReplOp::Reset { client, .. } => format!("R{client}"),
                        ReplOp::Message { id, .. } => format!("m{}", id.0),
                        ReplOp::Enqueue { item, .. } => format!("q{}", item.msg.0),
                        ReplOp::Send { .. } => "s".into(),
                        other => format!("{other:?}"),
                    })
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect()
    }

    #[test]
    fn full_images_go_in_batches_of_whole_sessions_below_the_batch_size() {
        // Each message counts 1,000 bytes (`ReplOp::size`), other ops 32.
        let mut named = HashSet::new();
        let mut ops = image("a", true, &[1, 2], &mut named);
        ops.extend(image("b", false, &[3, 2], &mut named));
        ops.extend(image("c", true, &[4], &mut named));
        let batches = image_batches_at(ops.clone(), 1500, 1 << 20);
        assert_eq!(
            shape(&batches),
            [
                "Ea Ra m1 q1 s m2 q2",
                // Message 2 went in the batch before: named again.
                "Rb m3 q3 s m2 q2",
                "Ec Rc m4 q4 s",
            ]
        );
        // Large enough: one batch, as before.
        assert_eq!(image_batches_at(ops.clone(), 1 << 20, 1 << 20), [ops]);
        assert!(image_batches_at(Vec::new(), 1, 1).is_empty());
    }

    #[test]
    fn a_session_past_the_split_size_is_split_before_its_messages_only() {
        let mut named = HashSet::new();
        let ops = image("a", true, &[1, 2, 3, 1], &mut named);
        let batches = image_batches_at(ops, 1 << 20, 1500);
        // Not between the epoch and the reset, nor between a message and
        // its entry, nor between an entry and its send; the entry of a
        // message sent in an earlier batch brings it again.
        assert_eq!(shape(&batches), ["Ea Ra m1 q1 s m2 q2", "m3 q3 m1 q1"]);
    }

    #[test]
    fn a_batch_past_the_split_size_goes_in_numbered_parts_cut_anywhere() {
        let mut named = HashSet::new();
        let ops = image("a", true, &[1, 2, 3], &mut named);
        // Each message counts 1,000 bytes, other ops 32: cut before the
        // op that would pass 1,100, wherever it falls.
        let parts = frame_parts_at(ops.clone(), 1100);
        assert_eq!(
            shape(&parts),
            [
                "Part { index: 0, last: false } Ea Ra m1 q1",
                "Part { index: 1, last: false } s m2 q2",
                "Part { index: 2, last: true } m3 q3",
            ]
        );
        // Joined without their marks, the parts are the copy.
        let joined: Vec<ReplOp> = parts
            .into_iter()
            .flat_map(|p| p.into_iter().skip(1))
            .collect();
        assert_eq!(joined, ops);
        // An operation larger than the split size is a part of its own.
        let parts = frame_parts_at(ops, 500);
        assert_eq!(parts.len(), 7);
        for p in &parts {
            let bytes: usize = p[1..].iter().map(ReplOp::size).sum();
            assert!(bytes <= 500 || p.len() == 2, "{p:?}");
        }
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
