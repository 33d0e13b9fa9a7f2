//! Which master of a Redis Cluster serves which slot: the failure domains of a cluster
//! store, and where each decision is sent.
//!
//! Every master address met gets a domain id (1, 2, ...), kept for the backend's life, so a
//! limiter's breaker for a node stays that node's. The map is read with `CLUSTER SLOTS` in
//! the background (see `cluster_link`); a slot is computed here as Redis computes it, from
//! the key's hash tag.

use std::fmt;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwapOption;
use redis::Value;

use crate::store::domain::FailureDomain;

/// How many slots a Redis Cluster has.
pub(super) const SLOTS: usize = 16_384;

/// A node's address, as the cluster names it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct Address {
    pub(super) host: String,
    pub(super) port: u16,
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// One reading of the slot map.
struct SlotMap {
    /// The domain id of each slot's master; 0 where no master serves it.
    owners: Vec<u16>,
    /// The masters of this reading, by domain id.
    masters: Vec<(u16, Address)>,
}

/// The cluster's slot map as last read, and every master address met so far.
#[derive(Default)]
pub(super) struct Topology {
    map: ArcSwapOption<SlotMap>,
    /// Domain id `i + 1` is `met[i]`.
    met: Mutex<Vec<Address>>,
}

impl Topology {
    /// Whether the slot map has been read at least once.
    pub(super) fn is_known(&self) -> bool {
        self.map.load().is_some()
    }

    /// The failure domain of `slot`: its master's, or the whole cluster's (0) while the
    /// map is unknown or no master serves the slot.
    pub(super) fn domain(&self, slot: u16) -> FailureDomain {
        match self.map.load().as_ref() {
            Some(map) => FailureDomain::new(u32::from(map.owners[usize::from(slot)])),
            None => FailureDomain::WHOLE,
        }
    }

    /// The master serving `slot`, if the map names one.
    pub(super) fn master(&self, slot: u16) -> Option<Address> {
        let map = self.map.load();
        let map = map.as_ref()?;
        let id = map.owners[usize::from(slot)];
        map.masters
            .iter()
            .find(|(master, _)| *master == id)
            .map(|(_, address)| address.clone())
    }

    /// The masters of the latest reading.
    pub(super) fn masters(&self) -> Vec<Address> {
        self.map
            .load()
            .as_ref()
            .map(|map| map.masters.iter().map(|(_, a)| a.clone()).collect())
            .unwrap_or_default()
    }

    /// The label of domain `id` (the master's address), while it serves slots.
    pub(super) fn label(&self, id: u32) -> Option<String> {
        if id == 0 {
            return Some(String::new());
        }
        let map = self.map.load();
        map.as_ref()?
            .masters
            .iter()
            .find(|(master, _)| u32::from(*master) == id)
            .map(|(_, address)| address.to_string())
    }

    /// The domain id of the node at `address`: the one it got when first met, or a new one
    /// now. A node a redirect names may not be in the latest reading yet.
    pub(super) fn id_of(&self, address: &Address) -> u32 {
        let mut met = self.met.lock().unwrap_or_else(|e| e.into_inner());
        u32::try_from(id_in(&mut met, address)).unwrap_or(0)
    }

    /// Takes a new reading: `ranges` of slots and their masters. Returns whether any slot
    /// changed hands.
    pub(super) fn update(&self, ranges: &[(u16, u16, Address)]) -> bool {
        let mut met = self.met.lock().unwrap_or_else(|e| e.into_inner());
        let mut owners = vec![0u16; SLOTS];
        let mut masters: Vec<(u16, Address)> = Vec::new();
        for (start, end, address) in ranges {
            let id = id_in(&mut met, address);
            // Ids beyond u16 would take more masters than a cluster can have.
            let Ok(id) = u16::try_from(id) else { continue };
            let (start, end) = (usize::from(*start), usize::from(*end).min(SLOTS - 1));
            if start <= end {
                owners[start..=end].fill(id);
            }
            if !masters.iter().any(|(known, _)| *known == id) {
                masters.push((id, address.clone()));
            }
        }
        masters.sort_unstable_by_key(|(id, _)| *id);
        let changed = self
            .map
            .load()
            .as_ref()
            .is_none_or(|old| old.owners != owners);
        if changed {
            self.map.store(Some(Arc::new(SlotMap { owners, masters })));
        }
        changed
    }
}

/// The domain id of `address` among the addresses `met` (id `i + 1` is `met[i]`), adding it
/// if it is new.
fn id_in(met: &mut Vec<Address>, address: &Address) -> usize {
    match met.iter().position(|known| known == address) {
        Some(index) => index + 1,
        None => {
            met.push(address.clone());
            met.len()
        }
    }
}

impl fmt::Debug for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Topology")
            .field("masters", &self.masters())
            .finish()
    }
}

/// The slot ranges and masters of a `CLUSTER SLOTS` reply from the node at `asked`:
/// `[[start, end, [host, port, id, ...], replicas...], ...]`. A master named without a
/// host (empty or `?`) is on the node that answered.
pub(super) fn parse_slots(reply: &Value, asked: &str) -> Option<Vec<(u16, u16, Address)>> {
    let Value::Array(ranges) = reply else {
        return None;
    };
    let mut parsed = Vec::with_capacity(ranges.len());
    for range in ranges {
        let Value::Array(fields) = range else {
            return None;
        };
        let [start, end, master, ..] = fields.as_slice() else {
            return None;
        };
        let number = |value: &Value| match value {
            Value::Int(n) => u16::try_from(*n).ok(),
            _ => None,
        };
        let Value::Array(node) = master else {
            return None;
        };
        let host = match node.first()? {
            Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok()?,
            Value::SimpleString(text) => text.clone(),
            _ => return None,
        };
        let host = if host.is_empty() || host == "?" {
            asked.to_owned()
        } else {
            host
        };
        let port = number(node.get(1)?)?;
        parsed.push((number(start)?, number(end)?, Address { host, port }));
    }
    Some(parsed)
}

/// The slot of `key`, as Redis computes it: CRC16 of its hash tag (the bytes between the
/// first `{` and the next `}`, if not empty), else of the whole key.
pub(super) fn slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16(hashed) % SLOTS as u16
}

/// The slot of every key whose hash tag is written into it (not empty), worked out as
/// the tag's bytes come, so that finding a caller's slot builds no key.
#[derive(Debug, Default)]
pub(super) struct TagSlot {
    crc: u16,
}

impl TagSlot {
    /// The tag goes on with `bytes`.
    #[inline]
    pub(super) fn add(&mut self, bytes: &[u8]) {
        self.crc = crc16_from(self.crc, bytes);
    }

    /// The slot of the tag written so far.
    pub(super) fn slot(&self) -> u16 {
        self.crc % SLOTS as u16
    }
}

/// CRC16-CCITT (XMODEM), the checksum Redis Cluster hashes keys with.
fn crc16(bytes: &[u8]) -> u16 {
    crc16_from(0, bytes)
}

/// [`crc16`] of what came before (whose checksum is `crc`) followed by `bytes`.
fn crc16_from(crc: u16, bytes: &[u8]) -> u16 {
    bytes.iter().fold(crc, |crc, &byte| {
        (crc << 8) ^ CRC16_TABLE[usize::from(((crc >> 8) as u8) ^ byte)]
    })
}

const CRC16_TABLE: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

#[cfg(test)]
mod tests {
    use super::*;

    fn address(port: u16) -> Address {
        Address {
            host: "127.0.0.1".to_owned(),
            port,
        }
    }

    #[test]
    fn slots_are_those_redis_computes() {
        // Values from `CLUSTER KEYSLOT` on Redis 7.
        assert_eq!(slot(b"foo"), 12_182);
        assert_eq!(slot(b"bar"), 5_061);
        assert_eq!(slot(b"123456789"), 12_739);
        assert_eq!(slot(b"rl:{acme}:orders:per-second:w1000"), slot(b"acme"));
        // An empty tag does not count: the whole key is hashed.
        assert_eq!(slot(b"a{}b"), crc16(b"a{}b") % 16_384);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(crc16(b"123456789"), 0x31C3);
    }

    #[test]
    fn a_tag_written_in_pieces_has_the_slot_of_the_whole() {
        let mut tag = TagSlot::default();
        for piece in [&b"user"[..], b"", b"1", b"000"] {
            tag.add(piece);
        }
        assert_eq!(tag.slot(), slot(b"user1000"));
    }

    #[test]
    fn a_master_keeps_its_domain_id_through_readings() {
        let topology = Topology::default();
        assert!(!topology.is_known());
        assert_eq!(topology.domain(5), FailureDomain::WHOLE);
        assert!(topology.update(&[
            (0, 5_460, address(7000)),
            (5_461, 10_922, address(7001)),
            (10_923, 16_383, address(7002)),
        ]));
        assert_eq!(topology.domain(0).id(), 1);
        assert_eq!(topology.domain(10_922).id(), 2);
        assert_eq!(topology.domain(16_383).id(), 3);
        assert_eq!(topology.label(2).as_deref(), Some("127.0.0.1:7001"));
        // The same reading again changes nothing.
        assert!(!topology.update(&[
            (0, 5_460, address(7000)),
            (5_461, 10_922, address(7001)),
            (10_923, 16_383, address(7002)),
        ]));
        // The master of 0-5460 fails over to its replica on 7003: a new domain; the lost
        // master's domain is no longer the cluster's.
        assert!(topology.update(&[
            (0, 5_460, address(7003)),
            (5_461, 10_922, address(7001)),
            (10_923, 16_383, address(7002)),
        ]));
        assert_eq!(topology.domain(0).id(), 4);
        assert_eq!(topology.domain(6_000).id(), 2);
        assert_eq!(topology.label(1), None);
        assert_eq!(topology.master(0), Some(address(7003)));
        // Back on 7000 later, it is domain 1 again.
        topology.update(&[(0, 16_383, address(7000))]);
        assert_eq!(topology.domain(12_000).id(), 1);
        // A node a redirect names keeps its id too, or gets the next one.
        assert_eq!(topology.id_of(&address(7001)), 2);
        assert_eq!(topology.id_of(&address(7010)), 5);
        assert_eq!(topology.id_of(&address(7010)), 5);
    }

    #[test]
    fn cluster_slots_replies_are_read() {
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5_460),
                Value::Array(vec![
                    Value::BulkString(b"10.0.0.1".to_vec()),
                    Value::Int(7000),
                    Value::BulkString(b"id".to_vec()),
                ]),
                Value::Array(vec![
                    Value::BulkString(b"10.0.0.4".to_vec()),
                    Value::Int(7003),
                ]),
            ]),
            Value::Array(vec![
                Value::Int(5_461),
                Value::Int(16_383),
                Value::Array(vec![Value::BulkString(Vec::new()), Value::Int(7001)]),
            ]),
        ]);
        let parsed = parse_slots(&reply, "10.0.0.2").unwrap();
        assert_eq!(
            parsed,
            [
                (
                    0,
                    5_460,
                    Address {
                        host: "10.0.0.1".to_owned(),
                        port: 7000
                    }
                ),
                (
                    5_461,
                    16_383,
                    Address {
                        host: "10.0.0.2".to_owned(),
                        port: 7001
                    }
                ),
            ]
        );
        assert_eq!(parse_slots(&Value::Int(3), "x"), None);
    }
}
