//! A session's resource limits: `limits: {memory, cpu, pids}` in its spec.
//!
//! This file is what a manifest says and what `apply` can check without the
//! node: the values' forms, and bounds that hold on any host. What only the
//! node knows (whether it can enforce a limit at all, and whether its host is
//! big enough) is [`enforce`]'s: a session whose limits a node cannot enforce
//! is not started there, and its reason says why. A limit is never ignored
//! silently.
//!
//! The forms, as Kubernetes writes resources:
//! - `memory`: bytes, as an integer or a string with a unit: `K`, `M`, `G`,
//!   `T` (powers of 1000; also `KB`, `MB`, ...) or `Ki`, `Mi`, `Gi`, `Ti`
//!   (powers of 1024; also `KiB`, `MiB`, ...). Stored as an integer.
//!   Swap is not granted beyond it.
//! - `cpu`: cores, as a number (`0.5`, `2`) or millicores (`"500m"`): a
//!   bandwidth quota (CFS), not a pinning. Stored as `"500m"`.
//! - `pids`: the most processes and threads the session may have at once;
//!   a fork past it fails (EAGAIN) and the session goes on.

#[cfg(feature = "node")]
pub mod enforce;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The smallest memory limit a spec may set: below it not even a shell
/// starts, which would read as a crash loop with no explanation.
pub const MIN_MEMORY: u64 = 4 << 20;
/// The largest memory limit (1 PiB), a bound that no host reaches.
pub const MAX_MEMORY: u64 = 1 << 50;
/// The smallest CPU quota: CFS refuses a quota below 1 ms per 100 ms period.
pub const MIN_CPU_MILLIS: u32 = 10;
/// The largest CPU limit, in millicores (1024 cores).
pub const MAX_CPU_MILLIS: u32 = 1024 * 1000;
/// The largest pids limit: Linux's own ceiling for `pid_max` (2^22).
pub const MAX_PIDS: u32 = 1 << 22;

/// A session's limits. Every field is optional; an empty `limits` is no
/// limit (and is stored as absent).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Bytes of memory (and swap: none beyond it).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "ser_memory",
        deserialize_with = "de_memory"
    )]
    pub memory: Option<u64>,
    /// Millicores of CPU bandwidth (1000 = one core).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "ser_cpu",
        deserialize_with = "de_cpu"
    )]
    pub cpu: Option<u32>,
    /// Processes and threads at once.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "de_pids"
    )]
    pub pids: Option<u32>,
}

impl Limits {
    /// No limit set.
    pub fn is_empty(&self) -> bool {
        self.memory.is_none() && self.cpu.is_none() && self.pids.is_none()
    }

    /// Bounds that hold on any host; the error names the field
    /// (`limits.memory`) and says what is allowed.
    pub fn validate(&self) -> std::result::Result<(), (&'static str, String)> {
        if let Some(m) = self.memory
            && !(MIN_MEMORY..=MAX_MEMORY).contains(&m)
        {
            return Err((
                "limits.memory",
                format!(
                    "{} is outside {} to {}",
                    format_bytes(m),
                    format_bytes(MIN_MEMORY),
                    format_bytes(MAX_MEMORY)
                ),
            ));
        }
        if let Some(c) = self.cpu
            && !(MIN_CPU_MILLIS..=MAX_CPU_MILLIS).contains(&c)
        {
            return Err((
                "limits.cpu",
                format!(
                    "{} is outside {} to {}",
                    format_cpu(c),
                    format_cpu(MIN_CPU_MILLIS),
                    format_cpu(MAX_CPU_MILLIS)
                ),
            ));
        }
        if let Some(p) = self.pids
            && !(1..=MAX_PIDS).contains(&p)
        {
            return Err(("limits.pids", format!("{p} is outside 1 to {MAX_PIDS}")));
        }
        Ok(())
    }

    /// How `describe` shows them: `memory 64 MiB, cpu 500m, pids 20`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(m) = self.memory {
            parts.push(format!("memory {}", format_bytes(m)));
        }
        if let Some(c) = self.cpu {
            parts.push(format!("cpu {}", format_cpu(c)));
        }
        if let Some(p) = self.pids {
            parts.push(format!("pids {p}"));
        }
        parts.join(", ")
    }
}

/// Bytes as people read them: `64 MiB`, `1.5 GiB`, `512 B`.
pub fn format_bytes(b: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 || v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Millicores as a spec writes them: `500m`, or `2` for whole cores.
pub fn format_cpu(m: u32) -> String {
    if m.is_multiple_of(1000) {
        format!("{}", m / 1000)
    } else {
        format!("{m}m")
    }
}

/// Parses a memory size: `67108864`, `64Mi`, `64MiB`, `1G`, `1.5Gi`.
pub fn parse_bytes(s: &str) -> std::result::Result<u64, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "K" | "KB" | "k" | "kB" => 1000,
        "M" | "MB" => 1_000_000,
        "G" | "GB" => 1_000_000_000,
        "T" | "TB" => 1_000_000_000_000,
        "Ki" | "KiB" => 1 << 10,
        "Mi" | "MiB" => 1 << 20,
        "Gi" | "GiB" => 1 << 30,
        "Ti" | "TiB" => 1 << 40,
        u => {
            return Err(format!(
                "unknown unit {u:?}: write bytes, or K, M, G, T (powers of 1000) or Ki, Mi, Gi, Ti (powers of 1024)"
            ));
        }
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size: write 64Mi, 1G or a number of bytes"))?;
    let v = n * mult as f64;
    if !v.is_finite() || v < 0.0 || v > u64::MAX as f64 {
        return Err(format!("{s:?} is out of range"));
    }
    Ok(v.round() as u64)
}

/// Parses a CPU amount into millicores: `"500m"`, `"0.5"`, `"2"`.
pub fn parse_cpu(s: &str) -> std::result::Result<u32, String> {
    let s = s.trim();
    let millis = if let Some(m) = s.strip_suffix('m') {
        m.parse::<u64>()
            .map_err(|_| format!("{s:?} is not a CPU amount: write 500m, 0.5 or 2"))?
    } else {
        let cores: f64 = s
            .parse()
            .map_err(|_| format!("{s:?} is not a CPU amount: write 500m, 0.5 or 2"))?;
        cores_to_millis(cores)?
    };
    u32::try_from(millis).map_err(|_| format!("{s:?} is out of range"))
}

fn cores_to_millis(cores: f64) -> std::result::Result<u64, String> {
    if !cores.is_finite() || cores < 0.0 {
        return Err(format!("{cores} is not a CPU amount: it must be positive"));
    }
    let m = (cores * 1000.0).round();
    if m > u32::MAX as f64 {
        return Err(format!("{cores} cores is out of range"));
    }
    Ok(m as u64)
}

fn ser_memory<S: Serializer>(v: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(b) => s.serialize_u64(*b),
        None => s.serialize_none(),
    }
}

fn ser_cpu<S: Serializer>(v: &Option<u32>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(m) => s.serialize_str(&format!("{m}m")),
        None => s.serialize_none(),
    }
}

/// A number or a string, as JSON carries either. Negative and fractional
/// numbers reach the parser, which says what is wrong with them, rather
/// than serde's "invalid type".
#[derive(Deserialize)]
#[serde(untagged)]
enum NumOrText {
    U(u64),
    I(i64),
    F(f64),
    S(String),
}

fn de_memory<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    use serde::de::Error;
    match NumOrText::deserialize(d)? {
        NumOrText::U(n) => Ok(Some(n)),
        NumOrText::I(n) => Err(D::Error::custom(format!(
            "{n} is negative: a memory limit is a size such as 64Mi"
        ))),
        NumOrText::F(f) if f >= 0.0 && f.fract() == 0.0 && f <= u64::MAX as f64 => {
            Ok(Some(f as u64))
        }
        NumOrText::F(f) => Err(D::Error::custom(format!(
            "{f} is not a number of bytes: write an integer or a size such as 64Mi"
        ))),
        NumOrText::S(s) => parse_bytes(&s).map(Some).map_err(D::Error::custom),
    }
}

fn de_cpu<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    use serde::de::Error;
    let millis = match NumOrText::deserialize(d)? {
        NumOrText::U(n) => cores_to_millis(n as f64),
        NumOrText::I(n) => Err(format!("{n} is negative: write 500m, 0.5 or 2")),
        NumOrText::F(f) => cores_to_millis(f),
        NumOrText::S(s) => parse_cpu(&s).map(u64::from),
    }
    .map_err(D::Error::custom)?;
    u32::try_from(millis)
        .map(Some)
        .map_err(|_| D::Error::custom("out of range"))
}

fn de_pids<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    use serde::de::Error;
    match NumOrText::deserialize(d)? {
        NumOrText::U(n) => u32::try_from(n)
            .map(Some)
            .map_err(|_| D::Error::custom(format!("{n} is out of range"))),
        NumOrText::I(n) => Err(D::Error::custom(format!(
            "{n} is negative: pids is a count of processes"
        ))),
        _ => Err(D::Error::custom(
            "pids is a whole number of processes, such as 64",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<Limits, String> {
        let l: Limits = serde_json::from_str(json).map_err(|e| e.to_string())?;
        l.validate().map_err(|(f, w)| format!("{f}: {w}"))?;
        Ok(l)
    }

    #[test]
    fn forms_people_write() {
        let l = parse(r#"{"memory": "64Mi", "cpu": "500m", "pids": 20}"#).unwrap();
        assert_eq!(l.memory, Some(64 << 20));
        assert_eq!(l.cpu, Some(500));
        assert_eq!(l.pids, Some(20));
        assert_eq!(
            parse(r#"{"memory": "1G"}"#).unwrap().memory,
            Some(1_000_000_000)
        );
        assert_eq!(
            parse(r#"{"memory": "1.5GiB"}"#).unwrap().memory,
            Some(3 << 29)
        );
        assert_eq!(
            parse(r#"{"memory": 8388608}"#).unwrap().memory,
            Some(8 << 20)
        );
        assert_eq!(parse(r#"{"cpu": 0.25}"#).unwrap().cpu, Some(250));
        assert_eq!(parse(r#"{"cpu": 2}"#).unwrap().cpu, Some(2000));
        assert_eq!(parse(r#"{"cpu": "1.5"}"#).unwrap().cpu, Some(1500));
        assert_eq!(l.describe(), "memory 64 MiB, cpu 500m, pids 20");
        // Stored canonically: the same limits, however written, have one
        // encoding (and so one digest).
        let a = serde_json::to_string(&parse(r#"{"memory": "64Mi", "cpu": 0.5}"#).unwrap());
        let b = serde_json::to_string(&parse(r#"{"cpu": "500m", "memory": 67108864}"#).unwrap());
        assert_eq!(a.unwrap(), b.unwrap());
        let round: Limits = serde_json::from_str(&serde_json::to_string(&l).unwrap()).unwrap();
        assert_eq!(round, l);
    }

    #[test]
    fn impossible_limits_are_refused_with_the_field_named() {
        for (json, field) in [
            (r#"{"memory": 0}"#, "limits.memory"),
            (r#"{"memory": "1Ki"}"#, "limits.memory"),
            (r#"{"memory": "2048Ti"}"#, "limits.memory"),
            (r#"{"cpu": 0}"#, "limits.cpu"),
            (r#"{"cpu": "1m"}"#, "limits.cpu"),
            (r#"{"cpu": 5000}"#, "limits.cpu"),
            (r#"{"pids": 0}"#, "limits.pids"),
            (r#"{"pids": 99999999}"#, "limits.pids"),
        ] {
            let e = parse(json).unwrap_err();
            assert!(e.starts_with(field), "{json}: {e}");
        }
        for json in [
            r#"{"memory": -5}"#,
            r#"{"memory": "64 parsecs"}"#,
            r#"{"memory": 1.5}"#,
            r#"{"cpu": -1}"#,
            r#"{"cpu": "fast"}"#,
            r#"{"pids": -3}"#,
            r#"{"pids": 2.5}"#,
            r#"{"disk": "1G"}"#,
        ] {
            assert!(parse(json).is_err(), "{json} accepted");
        }
    }
}
