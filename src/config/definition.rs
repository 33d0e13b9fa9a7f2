//! The shape of a limiter definition in a file, and its conversion into limits, a
//! limiter builder and a key extractor, each checked without a panic.

use std::collections::BTreeMap;
use std::time::Duration;

use http::HeaderName;
use serde::Deserialize;

use crate::config::duration;
use crate::http::key::{ClientIp, ConfiguredKey, DefinedKey, HeaderKey};
use crate::limiter::Limiter;
use crate::limiter::builder::{LimiterBuilder, MIN_STORE_TIMEOUT};
use crate::limiter::failure::FailurePolicy;
use crate::limiter::instances::InstanceCount;
use crate::limiter::limits::Limits;
use crate::store::algorithm::Algorithm;
use crate::store::build_error::BuildError;
use crate::store::caller::Caller;
use crate::store::policy::Policy;

/// One limiter as written in a configuration file; see the [module docs](super) for the
/// format. It is read whole from the file (any format serde reads) and turned into the
/// crate's types by its methods: [`limits`](Self::limits) (which needs at least one default
/// policy), [`builder`](Self::builder), [`on_store_failure`](Self::on_store_failure) and
/// [`key`](Self::key).
///
/// Its fields, each of which may be left out:
///
/// | field | what | as in code |
/// |---|---|---|
/// | `name` | the limiter's name; required once the limiter is given a store (unless the code sets a counter scope) | [`LimiterBuilder::name`] |
/// | `policies` | the policies of callers without a tier | [`Limits::policy`](crate::reload::Limits::policy) |
/// | `tiers` | each tier's policies, by tier name | [`Limits::tier`](crate::reload::Limits::tier) |
/// | `on_store_failure` | `"open"`, `"closed"`, `"static"` or `{ local_share = { instances = 4 } }` | [`LimiterBuilder::on_store_failure`] |
/// | `store_timeout` | how long a decision waits for the store, at least `"1ms"` | [`LimiterBuilder::store_timeout`] |
/// | `levels` | each budget level's policies, by level name (`org`, `team`) | [`Limits::level`](crate::reload::Limits::level) |
/// | `quotas` | callers' own quotas, by caller key then policy name: `{ acme = { per-minute = 250 } }`; applied by the key | [`Caller::with_quota`] |
/// | `key` | `{ header = "x-customer-id" }`, `{ client_ip = { trusted_proxies = ["10.0.0.0/8"], forwarded_header = "forwarded" } }` (both fields optional), `"client_ip"` (no proxy trusted) or `"global"`; either of the first two may add `within = [{ level = "org", header = "x-org-id" }]`, the budgets a request's headers name: a layer setting | [`RateLimitLayer::key`](crate::RateLimitLayer::key), [`DefinedKey`] |
///
/// Each policy has a `name` (what clients see in the `RateLimit-Policy` field), an
/// `algorithm` and that algorithm's numbers: `"sliding_window"` ([`Policy::sliding_window`])
/// and `"sliding_log"` ([`Policy::sliding_log`]) take `limit` requests in any `window`;
/// `"token_bucket"` ([`Policy::token_bucket`]) takes `rate` tokens every `period`, at most
/// `burst` held. Any policy may add a `lockout`: how long a caller who uses the quota up is
/// refused ([`Policy::lock_out_for`]).
///
/// ```
/// use tollgate::config::LimiterDefinition;
///
/// let definition: LimiterDefinition = toml::from_str(r#"
///     name = "search"
///     [[policies]]
///     name = "per-minute"
///     algorithm = "token_bucket"
///     rate = 60
///     period = "1m"
///     burst = 10
/// "#).unwrap();
/// assert_eq!(definition.name(), Some("search"));
/// assert_eq!(definition.limits().unwrap().policies()[0].name(), "per-minute");
/// ```
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct LimiterDefinition {
    name: Option<String>,
    #[serde(default)]
    policies: Vec<PolicyDefinition>,
    #[serde(default)]
    tiers: BTreeMap<String, Vec<PolicyDefinition>>,
    #[serde(default)]
    levels: BTreeMap<String, Vec<PolicyDefinition>>,
    #[serde(default)]
    quotas: BTreeMap<String, BTreeMap<String, u64>>,
    on_store_failure: Option<FailureDefinition>,
    #[serde(default, deserialize_with = "duration::deserialize_option")]
    store_timeout: Option<Duration>,
    key: Option<KeyDefinition>,
}

/// One policy: its name, its algorithm and that algorithm's numbers.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
struct PolicyDefinition {
    name: String,
    algorithm: AlgorithmName,
    limit: Option<u64>,
    #[serde(default, deserialize_with = "duration::deserialize_option")]
    window: Option<Duration>,
    rate: Option<u64>,
    #[serde(default, deserialize_with = "duration::deserialize_option")]
    period: Option<Duration>,
    burst: Option<u64>,
    #[serde(default, deserialize_with = "duration::deserialize_option")]
    lockout: Option<Duration>,
}

/// The algorithms, as a file names them.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum AlgorithmName {
    SlidingWindow,
    TokenBucket,
    SlidingLog,
}

/// A failure policy, as a file names it.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum FailureDefinition {
    Open,
    Closed,
    Static,
    LocalShare { instances: u64 },
}

/// A key, as a file names it: a name, or a table.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
enum KeyDefinition {
    Named(KeyName),
    Table(KeyTable),
}

/// The keys a file names by name alone.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum KeyName {
    ClientIp,
    Global,
}

/// A key as a table: a header or the client IP, and the budgets the request names.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
struct KeyTable {
    header: Option<String>,
    client_ip: Option<ClientIpDefinition>,
    #[serde(default)]
    within: Vec<BudgetDefinition>,
}

/// The client IP behind trusted proxies, read from a forwarding header.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
struct ClientIpDefinition {
    #[serde(default)]
    trusted_proxies: Vec<String>,
    forwarded_header: Option<String>,
}

/// A budget a request names: its level, and the header its key is in.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
struct BudgetDefinition {
    level: String,
    header: String,
}

impl LimiterDefinition {
    /// The default policies and tiers, checked as
    /// [`LimiterBuilder::try_build`] checks them: ready for
    /// [`Limiter::set_limits`](crate::Limiter::set_limits) or [`LimiterBuilder::limits`].
    ///
    /// A policy whose values cannot work is refused with
    /// [`BuildError::PolicyInDefinition`], which names its set and its name, so the entry of
    /// the file is easy to find:
    ///
    /// ```
    /// use tollgate::BuildError;
    /// use tollgate::config::LimiterDefinition;
    ///
    /// let definition: LimiterDefinition = serde_json::from_str(
    ///     r#"{ "policies": [{ "name": "per-second", "algorithm": "sliding_window", "limit": 0, "window": "1s" }] }"#,
    /// ).unwrap();
    /// let error = definition.limits().unwrap_err();
    /// assert!(matches!(error, BuildError::PolicyInDefinition { .. }));
    /// assert_eq!(
    ///     error.to_string(),
    ///     "policy \"per-second\" of the default policies: a sliding window or log needs a limit of at least 1"
    /// );
    /// ```
    pub fn limits(&self) -> Result<Limits, BuildError> {
        let mut limits = Limits::new();
        for policy in &self.policies {
            limits = limits.policy(policy.to_policy(None)?);
        }
        for (tier, policies) in &self.tiers {
            let policies = policies
                .iter()
                .map(|policy| policy.to_policy(Some(tier)))
                .collect::<Result<Vec<_>, _>>()?;
            limits = limits.tier(tier.as_str(), policies);
        }
        for (level, policies) in &self.levels {
            let policies = policies
                .iter()
                .map(|policy| policy.to_policy(Some(level)))
                .collect::<Result<Vec<_>, _>>()?;
            limits = limits.level(level.as_str(), policies);
        }
        limits.check()?;
        Ok(limits)
    }

    /// A builder with the definition's name, limits, failure policy and store timeout (the
    /// builder's defaults for those left out); add the backend and anything else, then
    /// build. A store timeout under 1 ms is refused.
    pub fn builder(&self) -> Result<LimiterBuilder, BuildError> {
        let mut builder = Limiter::builder().limits(self.limits()?);
        if let Some(name) = &self.name {
            builder = builder.name(name.as_str());
        }
        if let Some(failure) = self.on_store_failure()? {
            builder = builder.on_store_failure(failure);
        }
        if let Some(timeout) = self.store_timeout {
            if timeout < MIN_STORE_TIMEOUT {
                return Err(BuildError::StoreTimeoutTooShort { timeout });
            }
            builder = builder.store_timeout(timeout);
        }
        Ok(builder)
    }

    /// The key extractor the definition names, for
    /// [`RateLimitLayer::key`](crate::RateLimitLayer::key); `None` when it names none. A
    /// header name that is not one is refused.
    ///
    /// ```
    /// use tollgate::config::LimiterDefinition;
    /// use tollgate::key::ConfiguredKey;
    ///
    /// let definition: LimiterDefinition = toml::from_str(r#"key = "client_ip""#).unwrap();
    /// assert!(matches!(definition.key(), Ok(Some(ConfiguredKey::ClientIp(_)))));
    /// let bad: LimiterDefinition = toml::from_str(r#"key = { header = "x id" }"#).unwrap();
    /// assert!(bad.key().is_err());
    /// ```
    pub fn key(&self) -> Result<Option<ConfiguredKey>, BuildError> {
        let Some(definition) = &self.key else {
            return if self.quotas.is_empty() {
                Ok(None)
            } else {
                Err(BuildError::QuotasWithoutKey)
            };
        };
        let (key, within) = definition.to_key()?;
        if within.is_empty() && self.quotas.is_empty() {
            return Ok(Some(key));
        }
        let mut defined = DefinedKey::new(key);
        for (level, header) in within {
            defined = defined.within(level, header);
        }
        for (caller, quotas) in &self.quotas {
            for (policy, quota) in quotas {
                defined = defined.quota(caller.as_str(), policy.as_str(), *quota);
            }
        }
        Ok(Some(ConfiguredKey::Defined(defined)))
    }

    /// The failure policy the definition names (`on_store_failure`), as
    /// [`builder`](Self::builder) sets it; `None` when it names none. A local share among
    /// zero instances is refused.
    ///
    /// ```
    /// use tollgate::config::LimiterDefinition;
    ///
    /// let definition: LimiterDefinition = toml::from_str(r#"on_store_failure = "closed""#).unwrap();
    /// assert!(definition.on_store_failure().unwrap().is_some());
    /// let none: LimiterDefinition = toml::from_str("").unwrap();
    /// assert!(none.on_store_failure().unwrap().is_none());
    /// let zero: LimiterDefinition =
    ///     toml::from_str("on_store_failure = { local_share = { instances = 0 } }").unwrap();
    /// assert!(zero.on_store_failure().is_err());
    /// ```
    pub fn on_store_failure(&self) -> Result<Option<FailurePolicy>, BuildError> {
        self.on_store_failure
            .as_ref()
            .map(FailureDefinition::to_policy)
            .transpose()
    }

    /// The limiter's name (`name`), if the definition gives one.
    ///
    /// ```
    /// use tollgate::config::LimiterDefinition;
    ///
    /// let definition: LimiterDefinition = toml::from_str(r#"name = "orders""#).unwrap();
    /// assert_eq!(definition.name(), Some("orders"));
    /// ```
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// The store timeout (`store_timeout`), if the definition gives one; checked by
    /// [`builder`](Self::builder).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::config::LimiterDefinition;
    ///
    /// let definition: LimiterDefinition = toml::from_str(r#"store_timeout = "20ms""#).unwrap();
    /// assert_eq!(definition.store_timeout(), Some(Duration::from_millis(20)));
    /// ```
    pub fn store_timeout(&self) -> Option<Duration> {
        self.store_timeout
    }
}

impl PolicyDefinition {
    fn to_policy(&self, tier: Option<&String>) -> Result<Policy, BuildError> {
        let field = |field: &'static str, missing: bool| BuildError::PolicyField {
            tier: tier.cloned(),
            name: self.name.clone(),
            field,
            missing,
        };
        let required = |value: Option<u64>, name| value.ok_or_else(|| field(name, true));
        let unused = |present: bool, name| {
            if present {
                Err(field(name, false))
            } else {
                Ok(())
            }
        };
        let algorithm = match self.algorithm {
            AlgorithmName::SlidingWindow | AlgorithmName::SlidingLog => {
                unused(self.rate.is_some(), "rate")?;
                unused(self.period.is_some(), "period")?;
                unused(self.burst.is_some(), "burst")?;
                let window = self.window.ok_or_else(|| field("window", true))?;
                let limit = required(self.limit, "limit")?;
                if self.algorithm == AlgorithmName::SlidingLog {
                    Algorithm::try_sliding_log(limit, window)
                } else {
                    Algorithm::try_sliding_window(limit, window)
                }
            }
            AlgorithmName::TokenBucket => {
                unused(self.limit.is_some(), "limit")?;
                unused(self.window.is_some(), "window")?;
                let period = self.period.ok_or_else(|| field("period", true))?;
                Algorithm::try_token_bucket(
                    required(self.rate, "rate")?,
                    period,
                    required(self.burst, "burst")?,
                )
            }
        };
        algorithm
            .and_then(|algorithm| Policy::try_new(self.name.as_str(), algorithm))
            .map(|policy| match self.lockout {
                Some(lockout) => policy.lock_out_for(lockout),
                None => policy,
            })
            .map_err(|error| BuildError::PolicyInDefinition {
                tier: tier.cloned(),
                name: self.name.clone(),
                error: Box::new(error),
            })
    }
}

impl FailureDefinition {
    fn to_policy(&self) -> Result<FailurePolicy, BuildError> {
        Ok(match self {
            FailureDefinition::Open => FailurePolicy::open(),
            FailureDefinition::Closed => FailurePolicy::closed(),
            FailureDefinition::Static => FailurePolicy::fail_static(),
            FailureDefinition::LocalShare { instances: 0 } => {
                return Err(BuildError::ZeroInstances);
            }
            FailureDefinition::LocalShare { instances } => {
                FailurePolicy::local_share(InstanceCount::fixed(*instances))
            }
        })
    }
}

/// A header a file names, checked.
fn header(name: &str) -> Result<HeaderKey, BuildError> {
    HeaderName::try_from(name)
        .map(HeaderKey::from_name)
        .map_err(|_| BuildError::InvalidHeaderName(name.to_owned()))
}

impl KeyDefinition {
    /// The key, and the budgets it names by header.
    fn to_key(&self) -> Result<(ConfiguredKey, Vec<(String, HeaderKey)>), BuildError> {
        let table = match self {
            KeyDefinition::Named(KeyName::ClientIp) => {
                return Ok((ConfiguredKey::ClientIp(ClientIp::new()), Vec::new()));
            }
            KeyDefinition::Named(KeyName::Global) => {
                return Ok((ConfiguredKey::Global(Caller::new("*")), Vec::new()));
            }
            KeyDefinition::Table(table) => table,
        };
        let key = match (&table.header, &table.client_ip) {
            (Some(name), None) => ConfiguredKey::Header(header(name)?),
            (None, Some(client_ip)) => {
                let mut key = ClientIp::new().trusted_proxies(&client_ip.trusted_proxies)?;
                if let Some(name) = &client_ip.forwarded_header {
                    key = key.forwarded_header(header(name)?.name().clone());
                }
                ConfiguredKey::ClientIp(key)
            }
            _ => return Err(BuildError::AmbiguousKey),
        };
        let within = table
            .within
            .iter()
            .map(|budget| Ok((budget.level.clone(), header(&budget.header)?)))
            .collect::<Result<_, BuildError>>()?;
        Ok((key, within))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> LimiterDefinition {
        toml::from_str(text).expect("parses")
    }

    const WINDOW: &str = r#"
        [[policies]]
        name = "per-second"
        algorithm = "sliding_window"
        limit = 50
        window = "1s"
    "#;

    #[test]
    fn levels_quotas_and_a_key_behind_proxies_are_read() {
        let definition = read(&format!(
            r#"{WINDOW}
            [[levels.org]]
            name = "per-second"
            algorithm = "sliding_window"
            limit = 200
            window = "1s"

            [quotas]
            acme = {{ per-second = 120 }}

            [key]
            client_ip = {{ trusted_proxies = ["10.0.0.0/8"], forwarded_header = "forwarded" }}
            within = [{{ level = "org", header = "x-org-id" }}]
            "#
        ));
        let limits = definition.limits().unwrap();
        let (level, policies) = limits.levels().next().unwrap();
        assert_eq!((level, policies[0].quota()), ("org", 200));
        let Some(ConfiguredKey::Defined(key)) = definition.key().unwrap() else {
            panic!("a defined key");
        };
        use crate::http::key::{Extracted, KeyExtractor};
        let request = http::Request::get("/")
            .header("forwarded", "for=198.51.100.7")
            .header("x-org-id", "acme-corp")
            .extension(std::net::SocketAddr::from(([10, 1, 2, 3], 443)))
            .body(())
            .unwrap();
        let Extracted::Caller(caller) = key.extract(&request) else {
            panic!("a caller");
        };
        assert_eq!(
            caller.key(),
            &crate::store::caller::CallerKey::new("198.51.100.7")
        );
        assert_eq!(caller.levels().count(), 1);
        // A quota needs a key to find its caller by; a key reads one thing.
        let error = read(&format!("{WINDOW}\n[quotas]\nacme = {{ per-second = 1 }}"))
            .key()
            .unwrap_err();
        assert_eq!(error, BuildError::QuotasWithoutKey);
        let error = read(r#"key = { header = "x-id", client_ip = {} }"#)
            .key()
            .unwrap_err();
        assert_eq!(error, BuildError::AmbiguousKey);
    }

    #[test]
    fn policies_and_tiers_become_limits() {
        let definition = read(&format!(
            "{WINDOW}
            [[tiers.enterprise]]
            name = \"smooth\"
            algorithm = \"token_bucket\"
            rate = 120
            period = \"1s\"
            burst = 240"
        ));
        let limits = definition.limits().unwrap();
        assert_eq!(
            limits.policies(),
            [Policy::sliding_window(
                "per-second",
                crate::Quota::per_second(50)
            )]
        );
        let (tier, policies) = limits.tiers().next().unwrap();
        assert_eq!(tier, "enterprise");
        assert_eq!(
            policies,
            [Policy::token_bucket(
                "smooth",
                crate::Quota::per_second(120),
                240
            )]
        );
    }

    #[test]
    fn values_that_would_panic_a_constructor_are_typed_errors() {
        let error = read(&WINDOW.replace("limit = 50", "limit = 0"))
            .limits()
            .unwrap_err();
        assert_eq!(
            error,
            BuildError::PolicyInDefinition {
                tier: None,
                name: "per-second".into(),
                error: Box::new(BuildError::ZeroLimit),
            }
        );
        let error = read(&WINDOW.replace("limit = 50", "limit = 9007199254740992"))
            .limits()
            .unwrap_err();
        assert!(matches!(
            error,
            BuildError::PolicyInDefinition { error, .. } if matches!(*error, BuildError::Inexact)
        ));
        let error = read(&WINDOW.replace("\"per-second\"", "\"\""))
            .limits()
            .unwrap_err();
        assert!(matches!(
            error,
            BuildError::PolicyInDefinition { error, .. } if matches!(*error, BuildError::InvalidPolicyName(_))
        ));
        let error = read(&WINDOW.replace("\"1s\"", "\"0ms\""))
            .limits()
            .unwrap_err();
        assert!(matches!(
            error,
            BuildError::PolicyInDefinition { error, .. } if matches!(*error, BuildError::ShortPeriod)
        ));
    }

    #[test]
    fn sets_that_cannot_work_are_typed_errors() {
        let twice = read(&format!("{WINDOW}{WINDOW}")).limits().unwrap_err();
        assert_eq!(
            twice,
            BuildError::DuplicatePolicy {
                tier: None,
                name: "per-second".into()
            }
        );
        let empty = read("").limits().unwrap_err();
        assert_eq!(empty, BuildError::NoPolicies { tier: None });
    }

    #[test]
    fn each_algorithm_takes_its_own_fields() {
        let missing = read(&WINDOW.replace("window = \"1s\"", ""))
            .limits()
            .unwrap_err();
        assert_eq!(
            missing.to_string(),
            "policy \"per-second\" of the default policies needs `window`"
        );
        let foreign = read(&WINDOW.replace("limit = 50", "limit = 50\nburst = 3"))
            .limits()
            .unwrap_err();
        assert!(matches!(
            foreign,
            BuildError::PolicyField {
                field: "burst",
                missing: false,
                ..
            }
        ));
        let bucket = read(
            "[[policies]]\nname = \"b\"\nalgorithm = \"token_bucket\"\nrate = 1\nperiod = \"1s\"",
        );
        assert!(matches!(
            bucket.limits().unwrap_err(),
            BuildError::PolicyField {
                field: "burst",
                missing: true,
                ..
            }
        ));
    }

    #[test]
    fn a_sliding_log_is_read_like_a_sliding_window() {
        let log = read(&WINDOW.replace("sliding_window", "sliding_log"));
        assert_eq!(
            log.limits().unwrap().policies(),
            [Policy::sliding_log(
                "per-second",
                crate::Quota::per_second(50)
            )]
        );
        let too_large = read(
            &WINDOW
                .replace("sliding_window", "sliding_log")
                .replace("limit = 50", "limit = 20000"),
        )
        .limits()
        .unwrap_err();
        assert_eq!(
            too_large.to_string(),
            "policy \"per-second\" of the default policies: a sliding log keeps one entry per \
             admitted unit: its limit must be at most 10000, got 20000"
        );
        let foreign = read(
            &WINDOW
                .replace("sliding_window", "sliding_log")
                .replace("limit = 50", "limit = 50\nrate = 3"),
        );
        assert!(matches!(
            foreign.limits().unwrap_err(),
            BuildError::PolicyField {
                field: "rate",
                missing: false,
                ..
            }
        ));
    }

    /// A store timeout of 0 sends every remote decision to the failure policy: refused
    /// when the definition is turned into a builder, as one under a millisecond is.
    #[test]
    fn regression_a_store_timeout_under_a_millisecond_is_refused_in_a_definition() {
        let zero = read(&format!("store_timeout = \"0ms\"\n{WINDOW}"));
        let refused = zero.builder();
        assert!(refused.is_err(), "0 ms accepted: {refused:?}");
        assert_eq!(
            refused.unwrap_err().to_string(),
            "the store timeout (0ns) is under 1 ms: every remote decision would time out"
        );
        let mut short = read(WINDOW);
        short.store_timeout = Some(Duration::from_micros(999));
        assert!(short.builder().is_err(), "999 µs accepted");
        short.store_timeout = Some(Duration::from_millis(1));
        assert!(short.builder().is_ok());
    }

    #[test]
    fn malformed_files_fail_to_parse_with_the_line() {
        let unknown = toml::from_str::<LimiterDefinition>(&WINDOW.replace("limit", "limmit"))
            .unwrap_err()
            .to_string();
        assert!(unknown.contains("line 5"), "{unknown}");
        let duration = toml::from_str::<LimiterDefinition>(&WINDOW.replace("\"1s\"", "\"1 sec\""))
            .unwrap_err()
            .to_string();
        assert!(
            duration.contains("line 6") && duration.contains("unknown unit"),
            "{duration}"
        );
        let algorithm =
            toml::from_str::<LimiterDefinition>(&WINDOW.replace("sliding_window", "leaky"))
                .unwrap_err()
                .to_string();
        assert!(algorithm.contains("line 4"), "{algorithm}");
    }

    #[test]
    fn the_rest_of_the_definition_configures_the_builder_and_the_key() {
        let definition = read(&format!(
            "name = \"orders\"\nstore_timeout = \"50ms\"\non_store_failure = {{ local_share = {{ instances = 3 }} }}\nkey = \"client_ip\"\n{WINDOW}"
        ));
        let limiter = definition.builder().unwrap().build();
        assert_eq!(limiter.name(), "orders");
        assert!(matches!(
            format!("{limiter:?}"),
            debug if debug.contains("store_timeout: 50ms") && debug.contains("LocalShare")
        ));
        assert!(matches!(
            definition.key(),
            Ok(Some(ConfiguredKey::ClientIp(_)))
        ));
        let bad_header = read(&format!("key = {{ header = \"x customer\" }}\n{WINDOW}"));
        assert_eq!(
            bad_header.key().unwrap_err(),
            BuildError::InvalidHeaderName("x customer".into())
        );
        let zero = read(&format!(
            "on_store_failure = {{ local_share = {{ instances = 0 }} }}\n{WINDOW}"
        ));
        assert_eq!(zero.builder().unwrap_err(), BuildError::ZeroInstances);
        assert!(matches!(
            read(&format!("key = \"global\"\n{WINDOW}")).key(),
            Ok(Some(ConfiguredKey::Global(_)))
        ));
    }
}
