//! The spec's limits: bounds, defaults and clamping. Values outside a bound are clamped
//! to it, never rejected and never unlimited.

use crate::runtimes::DefaultLimits;

/// Bounds of `memoryBytes`.
pub const MEMORY_BYTES: (u64, u64) = (8 << 20, 512 << 20);
/// Bounds of `cpus`.
pub const CPUS: (f64, f64) = (0.1, 2.0);
/// Bounds of `pids`, and its default.
pub const PIDS: (u64, u64) = (1, 256);
/// Default `pids` for every runtime.
pub const DEFAULT_PIDS: u64 = 128;
/// Bounds of `outputBytes` (per stream), and its default.
pub const OUTPUT_BYTES: (u64, u64) = (1024, 256 << 10);
/// Default `outputBytes`.
pub const DEFAULT_OUTPUT_BYTES: u64 = 64 << 10;
/// Bounds of `wallTimeMs`.
pub const WALL_TIME_MS: (u64, u64) = (100, 20_000);

/// Limits as a request may give them: any JSON number, each optional.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RequestedLimits {
    /// Memory for the program.
    pub memory_bytes: Option<f64>,
    /// CPUs.
    pub cpus: Option<f64>,
    /// Processes and threads inside the sandbox.
    pub pids: Option<f64>,
    /// Per-stream output cap.
    pub output_bytes: Option<f64>,
    /// Wall time.
    pub wall_time_ms: Option<f64>,
}

/// Effective limits of one execution, every field within its bounds.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Limits {
    /// Memory for the program, bytes.
    pub memory_bytes: u64,
    /// CPUs (CFS quota).
    pub cpus: f64,
    /// Tasks inside the sandbox.
    pub pids: u64,
    /// Kept bytes per stream.
    pub output_bytes: u64,
    /// Wall time, ms.
    pub wall_time_ms: u64,
}

fn clamp_u64(v: Option<f64>, default: u64, (lo, hi): (u64, u64)) -> u64 {
    match v {
        // `as` saturates for out-of-range floats; NaN cannot come from JSON.
        Some(x) if x.is_finite() => (x.floor().max(0.0) as u64).clamp(lo, hi),
        Some(x) if x == f64::INFINITY => hi,
        Some(_) => lo,
        None => default.clamp(lo, hi),
    }
}

impl RequestedLimits {
    /// Resolves against a runtime's defaults and clamps every field to its bounds.
    pub fn resolve(&self, d: &DefaultLimits) -> Limits {
        let cpus = match self.cpus {
            Some(x) if x.is_finite() => x.clamp(CPUS.0, CPUS.1),
            Some(_) => CPUS.0,
            None => d.cpus.clamp(CPUS.0, CPUS.1),
        };
        Limits {
            memory_bytes: clamp_u64(self.memory_bytes, d.memory_bytes, MEMORY_BYTES),
            cpus,
            pids: clamp_u64(self.pids, DEFAULT_PIDS, PIDS),
            output_bytes: clamp_u64(self.output_bytes, DEFAULT_OUTPUT_BYTES, OUTPUT_BYTES),
            wall_time_ms: clamp_u64(self.wall_time_ms, d.wall_time_ms, WALL_TIME_MS),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> DefaultLimits {
        DefaultLimits {
            memory_bytes: 384 << 20,
            cpus: 1.5,
            wall_time_ms: 15_000,
        }
    }

    #[test]
    fn test_defaults_apply_when_omitted() {
        let l = RequestedLimits::default().resolve(&defaults());
        assert_eq!(
            l,
            Limits {
                memory_bytes: 384 << 20,
                cpus: 1.5,
                pids: 128,
                output_bytes: 65536,
                wall_time_ms: 15_000
            }
        );
    }

    #[test]
    fn test_clamped_at_both_ends() {
        let low = RequestedLimits {
            memory_bytes: Some(0.0),
            cpus: Some(0.0),
            pids: Some(-1.0),
            output_bytes: Some(1.0),
            wall_time_ms: Some(0.0),
        };
        assert_eq!(
            low.resolve(&defaults()),
            Limits {
                memory_bytes: 8 << 20,
                cpus: 0.1,
                pids: 1,
                output_bytes: 1024,
                wall_time_ms: 100
            }
        );
        let high = RequestedLimits {
            memory_bytes: Some(1e20),
            cpus: Some(64.0),
            pids: Some(1e9),
            output_bytes: Some(18446744073709551616.0),
            wall_time_ms: Some(1e20),
        };
        assert_eq!(
            high.resolve(&defaults()),
            Limits {
                memory_bytes: 512 << 20,
                cpus: 2.0,
                pids: 256,
                output_bytes: 256 << 10,
                wall_time_ms: 20_000
            }
        );
    }

    #[test]
    fn test_values_at_bounds_kept() {
        let at = RequestedLimits {
            memory_bytes: Some(8388608.0),
            cpus: Some(2.0),
            pids: Some(256.0),
            output_bytes: Some(1024.0),
            wall_time_ms: Some(20000.0),
        };
        assert_eq!(
            at.resolve(&defaults()),
            Limits {
                memory_bytes: 8 << 20,
                cpus: 2.0,
                pids: 256,
                output_bytes: 1024,
                wall_time_ms: 20_000
            }
        );
    }
}
