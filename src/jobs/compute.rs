//! Compute classes: the local terms each class means on this server (a CFS quota, a
//! memory cap, a CPU weight), and what a sandbox of a class costs at a rate. The
//! faces offer them (`wbx::compute`); the daemon applies the terms to the sandbox's
//! host cgroup.

use super::Money;
pub use crate::store::jobs::ClassRate as Rate;

/// One class and what it means here.
#[derive(Debug, PartialEq, Eq)]
pub struct Class {
    /// Its name in requests and answers.
    pub name: &'static str,
    /// vCPUs: the sandbox's CFS quota, in CPUs.
    pub vcpu: u32,
    /// Memory cap, MiB (its processes and its writable root together).
    pub mem_mb: u64,
    /// CPU weight among sandboxes (cgroup v2 `cpu.weight`, 100 = the kernel's
    /// default; v1 `cpu.shares` = weight × 10.24).
    pub cpu_weight: u32,
    /// What it means on this server, in words.
    pub terms: &'static str,
}

/// Every class the document names, in its order.
pub const CLASSES: &[Class] = &[
    Class {
        name: "economy",
        vcpu: 2,
        mem_mb: 512,
        cpu_weight: 100,
        terms: "2 vCPUs of CPU quota, 512 MiB, the default CPU weight (100)",
    },
    Class {
        name: "balanced",
        vcpu: 2,
        mem_mb: 1024,
        cpu_weight: 200,
        terms: "2 vCPUs of CPU quota, 1 GiB, twice the default CPU weight (200): under contention it gets twice an economy sandbox's share",
    },
    Class {
        name: "performance",
        vcpu: 2,
        mem_mb: 2048,
        cpu_weight: 400,
        terms: "2 vCPUs of CPU quota, 2 GiB, four times the default CPU weight (400): under contention it gets four times an economy sandbox's share",
    },
    Class {
        name: "memory",
        vcpu: 2,
        mem_mb: 8192,
        cpu_weight: 100,
        terms: "2 vCPUs of CPU quota, 8 GiB, the default CPU weight (100)",
    },
    Class {
        name: "dedicated",
        vcpu: 2,
        mem_mb: 4096,
        cpu_weight: 1000,
        terms: "a server the operator reserved for their organisation: 2 vCPUs of CPU quota, 4 GiB, ten times the default CPU weight (1000)",
    },
];

/// The class used when neither the request nor the tenant names one.
pub const DEFAULT: &str = "economy";

/// The class named `name`; `""` (records from before classes existed) is the default.
pub fn class(name: &str) -> Option<&'static Class> {
    let name = if name.is_empty() { DEFAULT } else { name };
    CLASSES.iter().find(|c| c.name == name)
}

/// The default class.
pub fn default_class() -> &'static Class {
    &CLASSES[0]
}

/// The names of every class, for messages.
pub fn names() -> String {
    CLASSES
        .iter()
        .map(|c| c.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// A job's class as accepted (a job from before classes: economy).
pub fn of_job(spec: &crate::store::jobs::JobSpec) -> &'static Class {
    class(&spec.compute_class).unwrap_or_else(default_class)
}

/// The cost of `ms` of run time of a sandbox of class `c` at rate `r`.
pub fn cost(c: &Class, r: Rate, ms: u64) -> Money {
    let cpu = Money::per_ms(Money(r.vcpu_s), ms, u64::from(c.vcpu) * 1000);
    // Thousandths of a GB (10^9 bytes) in the class's memory.
    let mem = Money::per_ms(Money(r.gb_s), ms, c.mem_mb * 1_048_576 / 1_000_000);
    Money(cpu.0 + mem.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_every_class_is_found_by_name_and_empty_is_economy() {
        for c in CLASSES {
            assert_eq!(class(c.name), Some(c));
        }
        assert_eq!(class("").map(|c| c.name), Some("economy"));
        assert_eq!(class("cpu-fast"), None);
        assert_eq!(class("Economy"), None);
    }

    #[test]
    fn test_cost_follows_the_class_terms() {
        let r = Rate {
            vcpu_s: Money::parse("0.00001").unwrap().0,
            gb_s: Money::parse("0.000002").unwrap().0,
        };
        // 10 s × (2 vCPU × 0.00001 + 0.536 GB × 0.000002).
        assert_eq!(
            cost(class("economy").unwrap(), r, 10_000).0,
            200_000 + 10_720
        );
        // 10 s × (2 vCPU × 0.00001 + 8.589 GB × 0.000002).
        assert_eq!(
            cost(class("memory").unwrap(), r, 10_000).0,
            200_000 + 171_780
        );
        assert_eq!(cost(class("memory").unwrap(), r, 0).0, 0);
    }
}
