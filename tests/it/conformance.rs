//! One suite, both backends: the in-process store and Redis decide the same scenarios the
//! same way.

use tollgate::store::Backend;
use tollgate::{Caller, Decision, InMemoryBackend, Limiter, Policy, Quota, RedisBackend};
use tollgate_testkit::redis::RedisServer;

// These tests are about decisions, not latency: every request is decided by Redis.
use crate::redis_backend::SLOW_TEST_MACHINE;

/// What a decision looks like once the timing (t) is left out: windows here are an hour
/// or longer, so the two stores' clocks cannot disagree on counts, only on milliseconds.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Allowed(Vec<(String, u64)>),
    Limited {
        remaining: Vec<(String, u64)>,
        violated: Vec<String>,
    },
    Other(String),
}

fn seen(decision: &Decision) -> Seen {
    let remaining = |info: &tollgate::decision::RateLimitInfo| {
        info.policies()
            .map(|p| (p.name().to_owned(), p.remaining()))
            .collect()
    };
    match decision {
        Decision::Allowed(info) => Seen::Allowed(remaining(info)),
        Decision::Limited(info) => Seen::Limited {
            remaining: remaining(info),
            violated: info.violated().map(|p| p.name().to_owned()).collect(),
        },
        other => Seen::Other(format!("{other:?}")),
    }
}

struct Scenario {
    name: &'static str,
    policies: Vec<Policy>,
    /// Callers in the order their requests arrive.
    requests: Vec<&'static str>,
}

fn scenarios() -> Vec<Scenario> {
    vec![
        Scenario {
            name: "one sliding window, one caller past its limit",
            policies: vec![Policy::sliding_window("per-hour", Quota::per_hour(5))],
            requests: vec!["acme"; 8],
        },
        Scenario {
            name: "two policies, the longer one refuses first",
            policies: vec![
                Policy::sliding_window("per-hour", Quota::per_hour(5)),
                Policy::sliding_window("per-day", Quota::per_day(3)),
            ],
            requests: vec!["acme"; 6],
        },
        Scenario {
            name: "two policies, the shorter one refuses first",
            policies: vec![
                Policy::sliding_window("per-hour", Quota::per_hour(2)),
                Policy::sliding_window("per-day", Quota::per_day(10)),
            ],
            requests: vec!["acme"; 5],
        },
        Scenario {
            name: "token bucket burst",
            policies: vec![Policy::token_bucket("bucket", Quota::per_hour(1), 4)],
            requests: vec!["acme"; 6],
        },
        Scenario {
            name: "mixed algorithms",
            policies: vec![
                Policy::token_bucket("bucket", Quota::per_hour(1), 3),
                Policy::sliding_window("per-day", Quota::per_day(4)),
            ],
            requests: vec!["acme"; 6],
        },
        Scenario {
            name: "callers interleaved, braces kept apart",
            policies: vec![Policy::sliding_window("per-hour", Quota::per_hour(2))],
            requests: vec![
                "acme", "acme}", "{acme}", "acme", "acme}", "acme", "{acme}", "acme}", "globex",
            ],
        },
    ]
}

async fn run(backend: impl Backend + Clone, scenario: &Scenario) -> Vec<Seen> {
    let limiter = scenario
        .policies
        .iter()
        .cloned()
        .fold(
            Limiter::builder()
                .name("conformance")
                .store_timeout(SLOW_TEST_MACHINE)
                .backend(backend),
            |b, p| b.policy(p),
        )
        .build();
    let mut seen_decisions = Vec::new();
    for caller in &scenario.requests {
        seen_decisions.push(seen(&limiter.check(&Caller::new(*caller)).await));
    }
    seen_decisions
}

#[tokio::test]
async fn both_backends_decide_alike() {
    let server = RedisServer::start();
    for (i, scenario) in scenarios().iter().enumerate() {
        let memory = run(InMemoryBackend::new(), scenario).await;
        // A fresh prefix per scenario keeps them apart, as a fresh in-process store does.
        let redis = crate::redis_backend::connected(
            RedisBackend::builder(server.url()).prefix(format!("scenario{i}")),
        )
        .await;
        let redis = run(redis, scenario).await;
        assert_eq!(memory, redis, "{}", scenario.name);
        assert!(
            memory.iter().any(|s| matches!(s, Seen::Limited { .. })),
            "{}: the scenario never reaches a limit",
            scenario.name
        );
    }
}
