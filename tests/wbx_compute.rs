//! Compute classes of the WBX face (`compute_class`, `/wbx/v1/compute/preferences`),
//! against the real daemon with real runsc, cgroups, LMDB and sockets: each class's
//! terms as the sandbox's host cgroup and the sandbox itself see them, the tenant's
//! default (durable across a restart), classes not offered and not known, the tenant's
//! memory bound at and above it, and a job's class and price fixed when it is accepted
//! (a restart with a new price list changes neither its price nor its cost).

mod common;
use common::wbx::*;
use common::Daemon;
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;

const PRICES: [(&str, &str); 3] = [
    ("ISOBOX_WBX_PRICE_VCPU_S", "0.00001"),
    ("ISOBOX_WBX_PRICE_GB_S", "0.000002"),
    ("ISOBOX_WBX_CLASS_PRICES", "performance=0.00004/0.0000025"),
];

fn prefs(d: &Daemon, key: Option<&str>) -> Value {
    let r = wbx(d, "GET", "/v1/compute/preferences", key, None);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

fn put_default(d: &Daemon, key: Option<&str>, class: &str) -> Value {
    let body = json!({ "default_compute_class": class });
    let r = wbx(d, "PUT", "/v1/compute/preferences", key, Some(&body));
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

fn create(d: &Daemon, key: Option<&str>, class: Option<&str>) -> Value {
    let mut body = json!({"network": {"mode": "none"}, "timeout_s": 600});
    if let Some(c) = class {
        body["compute_class"] = json!(c);
    }
    let r = wbx(d, "POST", "/v1/sandboxes", key, Some(&body));
    assert_eq!(r.status, 201, "{}\nlog:\n{}", r.text(), d.log());
    r.json()
}

fn exec(d: &Daemon, key: Option<&str>, id: &str, cmd: &str) -> Value {
    let r = wbx(
        d,
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        key,
        Some(&json!({ "cmd": cmd })),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

/// `MemTotal` in kB, from text that holds a `/proc/meminfo` line.
fn mem_total_kb(text: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no MemTotal in {text:?}"))
}

/// Every sandbox cgroup of the daemon's slice: (CPU weight, memory cap in bytes). On
/// cgroup v1 the weight is `cpu.shares`; on v2 `cpu.weight`.
fn cgroups(instance: &str) -> Vec<(u64, u64)> {
    let read = |p: &Path| -> u64 {
        std::fs::read_to_string(p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .trim()
            .parse()
            .unwrap()
    };
    let v1 = Path::new("/sys/fs/cgroup/cpu").join(instance);
    let (base, v1) = if v1.is_dir() {
        (v1, true)
    } else {
        (Path::new("/sys/fs/cgroup").join(instance), false)
    };
    let mut out: Vec<(u64, u64)> = std::fs::read_dir(&base)
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| {
            let name = e.file_name();
            if v1 {
                let mem = Path::new("/sys/fs/cgroup/memory")
                    .join(instance)
                    .join(&name)
                    .join("memory.limit_in_bytes");
                (read(&e.path().join("cpu.shares")), read(&mem))
            } else {
                (
                    read(&e.path().join("cpu.weight")),
                    read(&e.path().join("memory.max")),
                )
            }
        })
        .collect();
    out.sort_unstable();
    out
}

#[test]
fn test_a_sandbox_gets_its_class_terms_and_the_tenant_default_survives_a_restart() {
    let mut env: Vec<(&str, &str)> = PRICES.to_vec();
    env.push(("ISOBOX_API_KEYS", "ck-one,ck-two"));
    // economy (512) + memory (8192): at the bound.
    env.push(("ISOBOX_WBX_MAX_MEMORY_MB", "8704"));
    let mut d = Daemon::start_with(&env);
    d.wait_ready();
    let (k1, k2) = (Some("ck-one"), Some("ck-two"));

    // The classes, their terms and prices; economy by default.
    let p = prefs(&d, k1);
    assert_eq!(p["default_compute_class"], "economy", "{p}");
    assert_eq!(p["currency"], "EUR");
    let classes = p["classes"].as_array().unwrap();
    let row = |name: &str| -> Value {
        let c = classes.iter().find(|c| c["name"] == name).unwrap().clone();
        json!([
            c["offered"],
            c["vcpu"],
            c["mem_mb"],
            c["cpu_weight"],
            c["price"]["vcpu_s"],
            c["price"]["gb_s"]
        ])
    };
    assert_eq!(
        classes
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["economy", "balanced", "performance", "memory", "dedicated"]
    );
    assert_eq!(
        row("economy"),
        json!([true, 2, 512, 100, "0.000010 EUR", "0.000002 EUR"])
    );
    assert_eq!(
        row("balanced"),
        json!([true, 2, 1024, 200, "0.000010 EUR", "0.000002 EUR"])
    );
    assert_eq!(
        row("performance"),
        json!([true, 2, 2048, 400, "0.000040 EUR", "0.0000025 EUR"])
    );
    assert_eq!(
        row("memory"),
        json!([true, 2, 8192, 100, "0.000010 EUR", "0.000002 EUR"])
    );
    assert_eq!(row("dedicated").get(0), Some(&json!(false)));
    assert!(classes
        .iter()
        .all(|c| c["terms"].as_str().is_some_and(|t| t.contains("vCPU"))));

    // Bad preferences: each refused in the face's shape, and nothing changes.
    for (body, status, says) in [
        (
            json!({"default_compute_class": "turbo"}),
            400,
            "unknown compute class \"turbo\"",
        ),
        (
            json!({"default_compute_class": "cpu-fast"}),
            400,
            "one of economy, balanced, performance, memory, dedicated",
        ),
        (
            json!({"default_compute_class": "dedicated"}),
            403,
            "the dedicated class is not offered on this server",
        ),
        (
            json!({"default_compute_class": 5}),
            400,
            "default_compute_class: a string",
        ),
        (json!({}), 400, "default_compute_class: required"),
        (
            json!({"default_compute_class": "balanced", "extra": 1}),
            400,
            "extra",
        ),
    ] {
        let r = wbx(&d, "PUT", "/v1/compute/preferences", k1, Some(&body));
        assert_eq!(r.status, status, "{body}: {}", r.text());
        assert!(err(&r).contains(says), "{body}: {}", r.text());
    }
    let r = d.request(
        "PUT",
        "/wbx/v1/compute/preferences",
        &[("Authorization", "Bearer ck-one")],
        b"not json",
    );
    assert_eq!(r.status, 400, "{}", r.text());
    err(&r);
    assert_eq!(prefs(&d, k1)["default_compute_class"], "economy");

    // A tenant's default is its own.
    assert_eq!(
        put_default(&d, k1, "balanced")["default_compute_class"],
        "balanced"
    );
    assert_eq!(prefs(&d, k1)["default_compute_class"], "balanced");
    assert_eq!(prefs(&d, k2)["default_compute_class"], "economy");

    // The request's class wins; without one, the tenant's default.
    let bal = create(&d, k1, None);
    let perf = create(&d, k1, Some("performance"));
    let eco = create(&d, k2, None);
    for (sb, class, mem) in [
        (&bal, "balanced", 1024),
        (&perf, "performance", 2048),
        (&eco, "economy", 512),
    ] {
        assert_eq!(
            (
                sb["compute_class"].as_str(),
                sb["vcpu"].as_u64(),
                sb["mem_mb"].as_u64()
            ),
            (Some(class), Some(2), Some(mem)),
            "{sb}"
        );
    }
    for (class, status, says) in [
        (json!("turbo"), 400, "compute_class: unknown compute class"),
        (json!(7), 400, "compute_class: a string"),
        (
            json!("dedicated"),
            403,
            "the dedicated class is not offered",
        ),
    ] {
        let body = json!({"compute_class": class, "network": {"mode": "none"}});
        let r = wbx(&d, "POST", "/v1/sandboxes", k1, Some(&body));
        assert_eq!(r.status, status, "{class}: {}", r.text());
        assert!(err(&r).contains(says), "{class}: {}", r.text());
    }
    let got = wbx(
        &d,
        "GET",
        &format!("/v1/sandboxes/{}", perf["id"].as_str().unwrap()),
        k1,
        None,
    )
    .json();
    assert_eq!(
        (got["compute_class"].as_str(), got["mem_mb"].as_u64()),
        (Some("performance"), Some(2048))
    );

    // The kernel enforces the terms: the host cgroups' memory caps differ by exactly
    // the classes' memory, their CPU weights are 1×, 2× and 4× the default, and the
    // sandboxes themselves see their memory.
    let cg = cgroups(&d.instance);
    assert_eq!(cg.len(), 3, "{cg:?}");
    let (w0, m0) = cg[0];
    assert!(w0 == 1024 || w0 == 100, "{cg:?}");
    assert_eq!(cg[1], (2 * w0, m0 + (512 << 20)), "{cg:?}");
    assert_eq!(cg[2], (4 * w0, m0 + (1536 << 20)), "{cg:?}");
    let total = |sb: &Value, key| {
        let id = sb["id"].as_str().unwrap().to_string();
        let v = exec(&d, key, &id, "grep MemTotal /proc/meminfo");
        mem_total_kb(v["stdout"].as_str().unwrap())
    };
    let (e, b, p) = (total(&eco, k2), total(&bal, k1), total(&perf, k1));
    assert_eq!(
        (b - e, p - e),
        (512 * 1024, 1536 * 1024),
        "MemTotal kB: {e} {b} {p}"
    );
    // 1200 MiB, written: past an economy sandbox's 512, within performance's 2048.
    let v = exec(
        &d,
        k1,
        perf["id"].as_str().unwrap(),
        "python3 -c 'b = b\"x\" * (1200 << 20); print(len(b))'",
    );
    assert_eq!(v["stdout"], "1258291200\n", "{v}");
    let m = wbx(
        &d,
        "GET",
        &format!("/v1/sandboxes/{}/metrics", perf["id"].as_str().unwrap()),
        k1,
        None,
    )
    .json();
    assert_eq!(
        (m["vcpu"].as_u64(), m["mem_mb"].as_u64()),
        (Some(2), Some(2048)),
        "{m}"
    );

    // The tenant's memory bound counts each sandbox's class: economy (512) + memory
    // (8192) is at the bound of 8704; one more economy sandbox is over it.
    let mem = create(&d, k2, Some("memory"));
    assert_eq!(
        (mem["compute_class"].as_str(), mem["mem_mb"].as_u64()),
        (Some("memory"), Some(8192))
    );
    let r = wbx(
        &d,
        "POST",
        "/v1/sandboxes",
        k2,
        Some(&json!({"network": {"mode": "none"}})),
    );
    assert_eq!(r.status, 429, "{}", r.text());
    let msg = err(&r);
    assert!(
        msg.contains("ISOBOX_WBX_MAX_MEMORY_MB")
            && msg.contains("yours have 8704")
            && msg.contains("one more of class economy has 512"),
        "{msg}"
    );

    for (sb, key) in [(&bal, k1), (&perf, k1), (&eco, k2), (&mem, k2)] {
        let r = wbx(
            &d,
            "DELETE",
            &format!("/v1/sandboxes/{}", sb["id"].as_str().unwrap()),
            key,
            None,
        );
        assert!(r.status == 200 || r.status == 204, "{}", r.text());
    }

    // Durable: the defaults survive a restart; "" puts the server's back. This
    // restart lowers the tenants' memory below the memory class's: it is no longer
    // offered, and a tenant whose default it is gets 403 naming its default.
    assert_eq!(
        put_default(&d, k1, "performance")["default_compute_class"],
        "performance"
    );
    assert_eq!(
        put_default(&d, k2, "memory")["default_compute_class"],
        "memory"
    );
    d.stop_keep_data();
    let instance = d.instance.clone();
    let mut env2: Vec<(&str, &str)> = env
        .iter()
        .filter(|(k, _)| *k != "ISOBOX_WBX_MAX_MEMORY_MB")
        .copied()
        .collect();
    env2.push(("ISOBOX_INSTANCE", instance.as_str()));
    let d = Daemon::start_with(&env2);
    d.wait_ready();
    assert_eq!(prefs(&d, k1)["default_compute_class"], "performance");
    let p2 = prefs(&d, k2);
    assert_eq!(p2["default_compute_class"], "memory");
    let find = |name: &str| {
        p2["classes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap()
            .clone()
    };
    let memory = find("memory");
    assert_eq!(memory["offered"], false, "{memory}");
    assert!(
        memory["why_not_offered"]
            .as_str()
            .unwrap()
            .contains("ISOBOX_WBX_MAX_MEMORY_MB 4096"),
        "{memory}"
    );
    let economy = find("economy");
    assert_eq!(
        (economy["offered"].as_bool(), &economy["why_not_offered"]),
        (Some(true), &Value::Null)
    );
    let r = wbx(
        &d,
        "POST",
        "/v1/sandboxes",
        k2,
        Some(&json!({"network": {"mode": "none"}})),
    );
    assert_eq!(r.status, 403, "{}", r.text());
    let msg = err(&r);
    assert!(
        msg.starts_with("default_compute_class (yours") && msg.contains("8192 MiB"),
        "{msg}"
    );
    let r = wbx(
        &d,
        "PUT",
        "/v1/compute/preferences",
        k1,
        Some(&json!({"default_compute_class": "memory"})),
    );
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(put_default(&d, k2, "")["default_compute_class"], "economy");
    assert_eq!(put_default(&d, k1, "")["default_compute_class"], "economy");
    let again = wbx(
        &d,
        "PUT",
        "/v1/compute/preferences",
        k1,
        Some(&json!({"default_compute_class": null})),
    );
    assert_eq!(
        (again.status, again.json()["default_compute_class"].as_str()),
        (200, Some("economy"))
    );
    d.stop();
}

#[test]
fn test_a_job_s_class_and_price_are_fixed_when_it_is_accepted() {
    let instance = format!("isobox-compute{}", std::process::id());
    let _ = std::fs::remove_dir_all(std::env::temp_dir().join(&instance));
    let mut env: Vec<(&str, &str)> = PRICES.to_vec();
    env.push(("ISOBOX_INSTANCE", instance.as_str()));
    // The memory class is offered only where a tenant may have its 8 GiB.
    env.push(("ISOBOX_WBX_MAX_MEMORY_MB", "8192"));
    let mut d = Daemon::start_with(&env);
    d.wait_ready();
    let none = json!({"mode": "none"});

    // A memory-class job and an economy one: the job shows its class and the rate it
    // was accepted at, its sandbox has the class's memory, and the receipt says so.
    let mem = submit(
        &d,
        None,
        &json!({"command": "grep MemTotal /proc/meminfo", "compute_class": "memory", "network": none}),
    );
    assert_eq!(mem["compute_class"], "memory", "{mem}");
    assert_eq!(
        mem["class_price"],
        json!({"vcpu_s": "0.000010 EUR", "gb_s": "0.000002 EUR"})
    );
    let eco = submit(
        &d,
        None,
        &json!({"command": "grep MemTotal /proc/meminfo", "network": none}),
    );
    assert_eq!(eco["compute_class"], "economy", "{eco}");
    let kb = |job: &Value| {
        let id = job["id"].as_str().unwrap();
        let done = finished(&d, None, id, Duration::from_secs(120));
        assert_eq!(done["status"], "completed", "{done}");
        mem_total_kb(&wbx(&d, "GET", &format!("/v1/jobs/{id}/logs"), None, None).text())
    };
    assert_eq!(kb(&mem) - kb(&eco), (8192 - 512) * 1024);
    let receipt = wbx(
        &d,
        "GET",
        &format!("/v1/jobs/{}/receipt", mem["id"].as_str().unwrap()),
        None,
        None,
    )
    .json();
    assert_eq!(
        (
            receipt["runtime"]["compute_class"].as_str(),
            receipt["runtime"]["vcpu"].as_u64(),
            receipt["runtime"]["mem_mb"].as_u64()
        ),
        (Some("memory"), Some(2), Some(8192)),
        "{receipt}"
    );

    // The worst case uses the class: 160 s (100 and the 60 s reserve) of a memory
    // sandbox is 160 × (2 × 0.00001 + 8.589 × 0.000002) = 0.00594848, over 0.005; the
    // same job as economy (0.00337152) fits.
    let body = |class: &str| json!({"command": "true", "compute_class": class, "timeout_s": 100, "max_cost": "0.005", "network": none});
    let r = wbx(&d, "POST", "/v1/jobs", None, Some(&body("memory")));
    assert_eq!(r.status, 400, "{}", r.text());
    let msg = err(&r);
    assert!(
        msg.contains("could cost up to 0.005949 EUR") && msg.contains("timeout_s 74"),
        "{msg}"
    );
    let fits = submit(&d, None, &body("economy"));
    assert_eq!(fits["compute_class"], "economy");

    // Not offered, unknown: refused, in a job and in a batch (named by place).
    for (class, status, says) in [
        (
            json!("dedicated"),
            403,
            "compute_class: the dedicated class is not offered",
        ),
        (
            json!("turbo"),
            400,
            "compute_class: unknown compute class \"turbo\"",
        ),
        (json!(["memory"]), 400, "compute_class: a string"),
    ] {
        let r = wbx(
            &d,
            "POST",
            "/v1/jobs",
            None,
            Some(&json!({"command": "true", "compute_class": class})),
        );
        assert_eq!(r.status, status, "{class}: {}", r.text());
        assert!(err(&r).contains(says), "{class}: {}", r.text());
    }
    let batch = json!({"defaults": {"network": none}, "jobs": [{"command": "true"}, {"command": "true", "compute_class": "dedicated"}]});
    let r = wbx(&d, "POST", "/v1/batches", None, Some(&batch));
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(
        err(&r).contains("jobs[1].compute_class: the dedicated class is not offered"),
        "{}",
        r.text()
    );
    let batch = json!({"defaults": {"network": none, "compute_class": "balanced"}, "jobs": [{"command": "true"}, {"command": "true", "compute_class": "performance"}]});
    let r = wbx(&d, "POST", "/v1/batches", None, Some(&batch));
    assert_eq!(r.status, 202, "{}", r.text());
    let ids: Vec<String> = r.json()["job_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_str().unwrap().to_string())
        .collect();
    let classes: Vec<String> = ids
        .iter()
        .map(|id| {
            finished(&d, None, id, Duration::from_secs(120))["compute_class"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(classes, ["balanced", "performance"]);

    // The tenant's default applies to a job that names no class, at that class's rate.
    put_default(&d, None, "performance");
    let perf = submit(&d, None, &json!({"command": "sleep 1", "network": none}));
    assert_eq!(perf["compute_class"], "performance", "{perf}");
    assert_eq!(
        perf["class_price"],
        json!({"vcpu_s": "0.000040 EUR", "gb_s": "0.0000025 EUR"})
    );
    let pid = perf["id"].as_str().unwrap().to_string();
    let done = finished(&d, None, &pid, Duration::from_secs(120));
    assert_eq!(done["status"], "completed", "{done}");
    let cost = done["cost"].as_str().unwrap().to_string();
    assert_ne!(cost, "0.000000 EUR", "{done}");

    // Stats are per template and class.
    let stats = wbx(&d, "GET", "/v1/jobs/stats?days=1", None, None).json();
    let mut rows: Vec<(String, u64)> = stats["by_template"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                format!(
                    "{}/{}",
                    r["template"].as_str().unwrap(),
                    r["compute_class"].as_str().unwrap()
                ),
                r["jobs"].as_u64().unwrap(),
            )
        })
        .collect();
    rows.sort();
    assert_eq!(
        rows,
        [
            ("base/balanced".to_string(), 1),
            ("base/economy".to_string(), 2),
            ("base/memory".to_string(), 1),
            ("base/performance".to_string(), 2)
        ],
        "{stats}"
    );

    // A new price list: accepted jobs keep their rate and cost; new ones (a retry is
    // one) get the new rate; the default class stays.
    d.stop_keep_data();
    let mut env2: Vec<(&str, &str)> = env
        .iter()
        .filter(|(k, _)| *k != "ISOBOX_WBX_CLASS_PRICES")
        .copied()
        .collect();
    env2.push(("ISOBOX_WBX_CLASS_PRICES", "performance=0.00008/0.000005"));
    let d = Daemon::start_with(&env2);
    d.wait_ready();
    let old = wbx(&d, "GET", &format!("/v1/jobs/{pid}"), None, None).json();
    assert_eq!(
        old["class_price"],
        json!({"vcpu_s": "0.000040 EUR", "gb_s": "0.0000025 EUR"}),
        "{old}"
    );
    assert_eq!(old["cost"], cost.as_str(), "{old}");
    let p = prefs(&d, None);
    assert_eq!(p["default_compute_class"], "performance");
    let row = p["classes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "performance")
        .unwrap()
        .clone();
    assert_eq!(
        row["price"],
        json!({"vcpu_s": "0.000080 EUR", "gb_s": "0.000005 EUR"})
    );
    let new = submit(&d, None, &json!({"command": "true", "network": none}));
    assert_eq!(
        (
            new["compute_class"].as_str(),
            new["class_price"]["vcpu_s"].as_str()
        ),
        (Some("performance"), Some("0.000080 EUR"))
    );
    let r = wbx(
        &d,
        "POST",
        &format!("/v1/jobs/{pid}/retry"),
        None,
        Some(&json!({})),
    );
    assert_eq!(r.status, 202, "{}", r.text());
    let retried = r.json();
    assert_eq!(
        (
            retried["compute_class"].as_str(),
            retried["class_price"]["vcpu_s"].as_str()
        ),
        (Some("performance"), Some("0.000080 EUR"))
    );
    for id in [new["id"].as_str().unwrap(), retried["id"].as_str().unwrap()] {
        finished(&d, None, id, Duration::from_secs(120));
    }
    d.stop();
}
