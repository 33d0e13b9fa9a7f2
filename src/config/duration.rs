//! Durations as people write them in a configuration file: `"500ms"`, `"1s"`, `"1m"`,
//! `"1h"`, `"1d"`.

use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserializer, Visitor};

/// Parses a whole number followed by one unit: `ms`, `s`, `m`, `h` or `d`.
pub(crate) fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let count: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a duration: write a whole number and a unit, such as \"500ms\", \"1s\", \"1m\", \"1h\" or \"1d\""))?;
    let millis_per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => {
            return Err(format!(
                "{text:?}: unknown unit {unit:?}, use ms, s, m, h or d"
            ));
        }
    };
    count
        .checked_mul(millis_per_unit)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{text:?} is too long a duration"))
}

struct HumanDuration;

impl Visitor<'_> for HumanDuration {
    type Value = Duration;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a duration such as \"500ms\", \"1s\", \"1m\", \"1h\" or \"1d\"")
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Duration, E> {
        parse(text).map_err(E::custom)
    }
}

/// For `#[serde(deserialize_with)]` on a `Duration`.
pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Duration, D::Error> {
    deserializer.deserialize_str(HumanDuration)
}

/// For `#[serde(default, deserialize_with)]` on an `Option<Duration>`.
pub(crate) fn deserialize_option<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Duration>, D::Error> {
    deserialize(deserializer).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_unit_reads_as_written() {
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse("1h"), Ok(Duration::from_secs(3_600)));
        assert_eq!(parse("1d"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse(" 20ms "), Ok(Duration::from_millis(20)));
    }

    #[test]
    fn anything_else_is_refused_with_the_reason() {
        assert!(parse("1").unwrap_err().contains("unknown unit"));
        assert!(parse("1 s").unwrap_err().contains("unknown unit"));
        assert!(parse("1.5s").unwrap_err().contains("unknown unit"));
        assert!(parse("s").unwrap_err().contains("not a duration"));
        assert!(parse("-1s").unwrap_err().contains("not a duration"));
        assert!(parse("").unwrap_err().contains("not a duration"));
        assert!(
            parse("99999999999999999999d")
                .unwrap_err()
                .contains("not a duration")
        );
        assert!(
            parse("999999999999999999d")
                .unwrap_err()
                .contains("too long")
        );
    }
}
