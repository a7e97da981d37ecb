//! Optional durations in specs, written as humantime strings ("10s", "2m").

use serde::{Deserialize, Deserializer, Serializer};
use std::time::Duration;

pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_str(&humantime::format_duration(*d).to_string()),
        None => s.serialize_none(),
    }
}

pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let s = String::deserialize(d)?;
    humantime::parse_duration(&s).map(Some).map_err(|e| {
        serde::de::Error::custom(format!(
            "{s:?} is not a duration ({e}): write 250ms, 10s, 5m"
        ))
    })
}
