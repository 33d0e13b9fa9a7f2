//! Group `peers_frozen_store`: redis-server under SIGSTOP. For two seconds 64 tasks ask
//! for decisions, each call given up after two seconds: how many are answered, and how
//! fast. tollgate fails open behind its store timeout (20 ms) and breaker;
//! tower-rate-limiter's `RedisGcra` has no timeout of its own, so a call waits for the
//! connection to give up.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::Criterion;
use tollgate::{FailurePolicy, Limiter, RedisBackend};
use tollgate_testkit::redis::RedisServer;
use tower_rate_limiter::RateLimitPolicy;

use crate::redis::gcra;
use crate::report::{Row, ms, per_sec, write_rows};
use crate::support::{CALLERS, TASKS, big_bucket, callers, multi_thread_runtime, wanted};

/// How long the tasks keep asking, and how long one call may take before it counts as
/// unanswered.
const WINDOW: Duration = Duration::from_secs(2);

/// What 64 tasks got in [`WINDOW`].
struct Frozen {
    answered: usize,
    unanswered: usize,
    p99: Option<Duration>,
}

async fn while_frozen<F, Fut>(decide: F) -> Frozen
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let end = Instant::now() + WINDOW;
    let tasks: Vec<_> = (0..TASKS as usize)
        .map(|t| {
            let decide = decide.clone();
            tokio::spawn(async move {
                let (mut latencies, mut unanswered, mut i) = (Vec::new(), 0, t * 97);
                while Instant::now() < end {
                    let start = Instant::now();
                    match tokio::time::timeout(WINDOW, decide(i % CALLERS)).await {
                        Ok(()) => latencies.push(start.elapsed()),
                        Err(_) => unanswered += 1,
                    }
                    i += TASKS as usize;
                }
                (latencies, unanswered)
            })
        })
        .collect();
    let (mut latencies, mut unanswered) = (Vec::new(), 0);
    for task in tasks {
        let (l, u) = task.await.expect("task");
        latencies.extend(l);
        unanswered += u;
    }
    latencies.sort();
    let p99 = (!latencies.is_empty()).then(|| {
        let rank = ((latencies.len() as f64 * 0.99).ceil() as usize).clamp(1, latencies.len());
        latencies[rank - 1]
    });
    Frozen {
        answered: latencies.len(),
        unanswered,
        p99,
    }
}

fn describe(frozen: &Frozen) -> String {
    format!(
        "{} answered in {} s ({}), p99 {}, {} unanswered after {} s",
        frozen.answered,
        WINDOW.as_secs(),
        per_sec(frozen.answered as f64 / WINDOW.as_secs_f64()),
        frozen.p99.map_or("—".to_owned(), ms),
        frozen.unanswered,
        WINDOW.as_secs(),
    )
}

pub(crate) fn bench(_: &mut Criterion) {
    const GROUP: &str = "peers_frozen_store";
    if !wanted(GROUP) {
        return;
    }
    let mut server = RedisServer::start();
    let runtime = multi_thread_runtime(2);
    let limiter = {
        let _guard = runtime.enter();
        Limiter::builder()
            .name("frozen-store")
            .backend(
                RedisBackend::builder(server.url())
                    .build()
                    .expect("backend"),
            )
            .policy(big_bucket())
            .on_store_failure(FailurePolicy::open())
            .build()
    };
    let peer = gcra(&runtime, &server, "frozen");
    let callers = callers(CALLERS);
    let keys: Arc<[String]> = (0..CALLERS).map(|i| format!("customer-{i:07}")).collect();
    // Both connected and answering before the freeze.
    runtime.block_on(async {
        assert!(limiter.check(&callers[0]).await.is_allowed());
        peer.check(keys[0].clone())
            .await
            .expect("tower-rate-limiter answers");
    });

    server.pause();
    let ours = runtime.block_on(while_frozen({
        let (limiter, callers) = (limiter.clone(), callers.clone());
        move |i| {
            let check = limiter.check(&callers[i]);
            async move {
                check.await;
            }
        }
    }));
    let theirs = runtime.block_on(while_frozen({
        let (peer, keys) = (peer.clone(), keys.clone());
        move |i| {
            let check = peer.check(keys[i].clone());
            async move {
                // An error is an answer: its layer then fails open or closed at once.
                let _ = check.await;
            }
        }
    }));
    server.resume();

    let ratio = match theirs.answered {
        0 => "∞ (the peer answered nothing)".to_owned(),
        n => format!("{:.0}x", ours.answered as f64 / n as f64),
    };
    write_rows(
        "peers_frozen_store.tsv",
        &[(
            "frozen_store/tower_rate_limiter",
            Row::new(
                "Frozen store (SIGSTOP), 64 tasks for 2 s, tollgate failing open, vs tower-rate-limiter's Redis GCRA",
                describe(&ours),
            )
            .peer(format!("tower-rate-limiter `RedisGcra`: {}", describe(&theirs)))
            .ratio(ratio),
        )],
    );
}
