//! Fault injection for the emulated device, and its seeded random source.

use std::time::Duration;

/// Faults applied to work requests posted by an initiator QP of the emulated device.
///
/// The four probabilities are drawn once per work request (one draw, so their sum must
/// not exceed 1); `delay` applies to every completion.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct EmulatedFaults {
    /// Probability that a work request is dropped and never completes: no completion at
    /// all, not even when the QP is moved to the error state (what a SIGKILLed peer often
    /// looks like).
    pub silent_loss: f64,
    /// Probability that a work request is not sent and completes with `RetryExcErr` after
    /// the QP's modeled transport timeout (the default 14/7 timeout when the QP's timeout is
    /// infinite).
    pub retry_exceeded: f64,
    /// Probability that a work request completes with `RemAccessErr` without touching
    /// remote memory.
    pub remote_access: f64,
    /// Probability that a work request's bytes are corrupted on the way: one byte of a
    /// WRITE's payload or of a READ's response is flipped, and the work request completes
    /// successfully (what an end-to-end check, `verify`, is there to catch).
    pub corrupt: f64,
    /// Extra time before each completion is delivered.
    pub delay: Duration,
    /// Seed of the random source deciding the faults.
    pub seed: u64,
}

/// A fault specification that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid emulated verbs fault spec {spec:?}: {reason} (expected e.g. \"silent_loss=0.1,retry_exceeded=0.05,remote_access=0,corrupt=0,delay_ms=5,seed=7\")")]
pub struct FaultSpecError {
    /// The specification given.
    pub spec: String,
    /// What is wrong with it.
    pub reason: String,
}

impl EmulatedFaults {
    /// Parses `key=value` pairs separated by commas: `silent_loss`, `retry_exceeded`,
    /// `remote_access`, `corrupt` (probabilities in 0..=1), `delay_ms` (milliseconds) and `seed`.
    /// Keys left out keep their default (no fault); an empty spec means no faults.
    ///
    /// # Errors
    /// An unknown key, a repeated key, a value that is not a number, a probability outside
    /// 0..=1 or probabilities summing above 1.
    pub fn parse(spec: &str) -> Result<Self, FaultSpecError> {
        let fail = |reason: String| FaultSpecError {
            spec: spec.to_owned(),
            reason,
        };
        let mut faults = Self::default();
        let mut seen: Vec<&str> = Vec::new();
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((key, value)) = part.split_once('=') else {
                return Err(fail(format!("{part:?} is not key=value")));
            };
            let (key, value) = (key.trim(), value.trim());
            if seen.contains(&key) {
                return Err(fail(format!("{key} given twice")));
            }
            seen.push(key);
            let probability = |v: &str| -> Result<f64, FaultSpecError> {
                let p: f64 = v
                    .parse()
                    .map_err(|_| fail(format!("{key}={v} is not a number")))?;
                if !(0.0..=1.0).contains(&p) {
                    return Err(fail(format!("{key}={v} is not a probability in 0..=1")));
                }
                Ok(p)
            };
            let integer = |v: &str| -> Result<u64, FaultSpecError> {
                v.parse()
                    .map_err(|_| fail(format!("{key}={v} is not a non-negative integer")))
            };
            match key {
                "silent_loss" => faults.silent_loss = probability(value)?,
                "retry_exceeded" => faults.retry_exceeded = probability(value)?,
                "remote_access" => faults.remote_access = probability(value)?,
                "corrupt" => faults.corrupt = probability(value)?,
                "delay_ms" => faults.delay = Duration::from_millis(integer(value)?),
                "seed" => faults.seed = integer(value)?,
                other => {
                    return Err(fail(format!(
                        "unknown key {other:?} (known: silent_loss, retry_exceeded, remote_access, corrupt, delay_ms, seed)"
                    )))
                }
            }
        }
        let sum =
            faults.silent_loss + faults.retry_exceeded + faults.remote_access + faults.corrupt;
        if sum > 1.0 + 1e-9 {
            return Err(fail(format!("probabilities sum to {sum}, above 1")));
        }
        Ok(faults)
    }
}

/// What the fault draw decided for one work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    None,
    SilentLoss,
    RetryExceeded,
    RemoteAccess,
    Corrupt,
}

impl EmulatedFaults {
    /// Decides the fault for a draw `u` in `0..1`.
    pub(crate) fn decide(&self, u: f64) -> Fault {
        if u < self.silent_loss {
            Fault::SilentLoss
        } else if u < self.silent_loss + self.retry_exceeded {
            Fault::RetryExceeded
        } else if u < self.silent_loss + self.retry_exceeded + self.remote_access {
            Fault::RemoteAccess
        } else if u < self.silent_loss + self.retry_exceeded + self.remote_access + self.corrupt {
            Fault::Corrupt
        } else {
            Fault::None
        }
    }

    /// Whether any fault can happen (no random draw is needed otherwise).
    pub(crate) fn any(&self) -> bool {
        self.silent_loss > 0.0
            || self.retry_exceeded > 0.0
            || self.remote_access > 0.0
            || self.corrupt > 0.0
    }
}

/// The faults in force for the contexts of one provider, and their random source.
#[derive(Debug)]
pub(crate) struct FaultState {
    inner: std::sync::Mutex<(EmulatedFaults, Rng)>,
}

impl FaultState {
    pub(crate) fn new(faults: EmulatedFaults) -> Self {
        Self {
            inner: std::sync::Mutex::new((faults, Rng::new(faults.seed))),
        }
    }

    /// Replaces the faults and reseeds the random source.
    pub(crate) fn set(&self, faults: EmulatedFaults) {
        *self.inner.lock().unwrap_or_else(|e| e.into_inner()) = (faults, Rng::new(faults.seed));
    }

    pub(crate) fn get(&self) -> EmulatedFaults {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).0
    }

    /// The fault for the next work request, and the completion delay.
    pub(crate) fn draw(&self) -> (Fault, Duration) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let (faults, rng) = &mut *g;
        let fault = if faults.any() {
            faults.decide(rng.next_f64())
        } else {
            Fault::None
        };
        (fault, faults.delay)
    }
}

/// xorshift64* seeded through splitmix64 (any seed, 0 included, gives a good state).
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        Self(if z == 0 { 0x2545_F491_4F6C_DD1D } else { z })
    }

    /// Seeded from the OS (falls back to the clock and pid).
    pub(crate) fn from_os() -> Self {
        let mut b = [0u8; 8];
        if getrandom::fill(&mut b).is_err() {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            b = (nanos ^ u64::from(std::process::id()) << 32).to_le_bytes();
        }
        Self::new(u64::from_le_bytes(b))
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..1`.
    pub(crate) fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_full_spec() {
        let f = EmulatedFaults::parse(
            "silent_loss=0.1, retry_exceeded=0.05,remote_access=0,corrupt=0.25,delay_ms=5,seed=7",
        )
        .expect("valid spec");
        assert_eq!(
            f,
            EmulatedFaults {
                silent_loss: 0.1,
                retry_exceeded: 0.05,
                remote_access: 0.0,
                corrupt: 0.25,
                delay: Duration::from_millis(5),
                seed: 7,
            }
        );
        assert_eq!(EmulatedFaults::parse(""), Ok(EmulatedFaults::default()));
    }

    #[test]
    fn refuses_bad_specs_with_a_reason() {
        for (spec, needle) in [
            ("silent_loss", "not key=value"),
            ("silent_loss=x", "not a number"),
            ("silent_loss=1.5", "probability"),
            ("delay_ms=-1", "non-negative integer"),
            ("loss=0.1", "unknown key"),
            ("seed=1,seed=2", "given twice"),
            ("silent_loss=0.6,remote_access=0.6", "sum"),
        ] {
            let err = EmulatedFaults::parse(spec).expect_err(spec);
            assert!(err.to_string().contains(needle), "{spec}: {err}");
            assert_eq!(err.spec, spec);
        }
    }

    #[test]
    fn decide_partitions_the_unit_interval() {
        let f = EmulatedFaults {
            silent_loss: 0.1,
            retry_exceeded: 0.2,
            remote_access: 0.3,
            corrupt: 0.1,
            ..Default::default()
        };
        assert_eq!(f.decide(0.05), Fault::SilentLoss);
        assert_eq!(f.decide(0.2), Fault::RetryExceeded);
        assert_eq!(f.decide(0.5), Fault::RemoteAccess);
        assert_eq!(f.decide(0.65), Fault::Corrupt);
        assert_eq!(f.decide(0.75), Fault::None);
    }

    #[test]
    fn rng_is_deterministic_and_spread() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        let xs: Vec<f64> = (0..1000).map(|_| a.next_f64()).collect();
        let ys: Vec<f64> = (0..1000).map(|_| b.next_f64()).collect();
        assert_eq!(xs, ys);
        assert!(xs.iter().all(|x| (0.0..1.0).contains(x)));
        let below = xs.iter().filter(|&&x| x < 0.5).count();
        assert!((400..600).contains(&below), "{below}");
        assert_ne!(Rng::new(0).next_u64(), 0);
    }
}
