//! Group `memory`: bytes per tracked key at 1,000,000 keys, each measured by RSS in a fresh
//! child process (this bench binary run again with [`CHILD`] set).

use std::fs;
use std::num::NonZeroU32;
use std::process::Command;

use criterion::Criterion;
use tollgate::{Caller, InMemoryBackend, Limiter, Policy, Quota};

use crate::report::{Row, write_rows};
use crate::support::ready_now;
use crate::support::wanted;

const MEMORY_KEYS: usize = 1_000_000;

/// Set in the child processes that measure memory: which limiter to measure.
pub(crate) const CHILD: &str = "TOLLGATE_BENCH_MEMORY_CHILD";

/// The resident set size of this process, from /proc/self/status.
pub(crate) fn rss_bytes() -> u64 {
    let status = fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .expect("VmRSS")
        * 1024
}

/// In a fresh child process: tracks 1,000,000 keys and prints the RSS growth per key.
pub(crate) fn measure(which: &str) {
    let key = |i: usize| format!("customer-{i:010}");
    let (before, after, tracked) = match which {
        "tollgate" => {
            // A cap above the key count, so that all of them stay tracked.
            let backend = InMemoryBackend::new().max_keys(2 * MEMORY_KEYS);
            let limiter = Limiter::builder()
                .name("memory")
                .backend(backend.clone())
                .policy(Policy::sliding_window(
                    "per-minute",
                    Quota::per_minute(1_000),
                ))
                .build();
            let before = rss_bytes();
            for i in 0..MEMORY_KEYS {
                assert!(ready_now(limiter.check(&Caller::new(key(i)))).is_allowed());
            }
            (before, rss_bytes(), backend.tracked_keys())
        }
        "governor" => {
            let quota = governor::Quota::per_minute(NonZeroU32::new(1_000).expect("non-zero"));
            let limiter = governor::RateLimiter::keyed(quota);
            let before = rss_bytes();
            for i in 0..MEMORY_KEYS {
                limiter.check_key(&key(i)).expect("admitted");
            }
            (before, rss_bytes(), limiter.len())
        }
        other => panic!("unknown memory measurement {other}"),
    };
    println!(
        "{}\t{tracked}",
        after.saturating_sub(before) as f64 / tracked as f64
    );
}

fn memory_child(which: &str) -> (f64, usize) {
    let exe = std::env::current_exe().expect("the bench binary");
    let output = Command::new(exe)
        .env(CHILD, which)
        .output()
        .expect("run the memory child");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "memory child {which} failed: {text}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut fields = text.trim().split('\t');
    let bytes = fields.next().and_then(|f| f.parse().ok());
    let tracked = fields.next().and_then(|f| f.parse().ok());
    bytes
        .zip(tracked)
        .unwrap_or_else(|| panic!("unexpected memory child output: {text}"))
}

pub(crate) fn bench(_c: &mut Criterion) {
    if !wanted("memory") {
        return;
    }
    let (ours, tracked) = memory_child("tollgate");
    let (peer, peer_tracked) = memory_child("governor");
    write_rows(
        "memory.tsv",
        &[(
            "memory/bytes_per_key",
            Row::new(
                "Memory: bytes per tracked key, in-process backend at 1,000,000 keys (RSS growth)",
                format!("{ours:.0} B ({tracked} keys tracked)"),
            )
            .peer(format!(
                "governor keyed (String keys): {peer:.0} B ({peer_tracked} keys)"
            ))
            .ratio(format!("{:.2}x", ours / peer))
            .target("≤ 128 B", ours <= 128.0),
        )],
    );
}
