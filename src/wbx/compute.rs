//! Compute classes on one server (`compute_class`, `GET`/`PUT /v1/compute/preferences`).
//!
//! The document's classes choose among servers. This daemon is one server, so each
//! class is a set of local terms that the kernel enforces on the sandbox's host
//! cgroup: a CFS quota (its vCPUs), a memory cap, and a CPU weight that decides who
//! gets the CPU when sandboxes compete for it. A class is never a promise of speed
//! beyond those terms. Which classes are offered, and their prices, are operator
//! settings (`ISOBOX_WBX_COMPUTE_CLASSES`, `ISOBOX_WBX_CLASS_PRICES`); `dedicated` is
//! offered only when the operator lists it, and means that the operator has reserved
//! this server for their organisation.

use super::error;
use crate::http::{Request, Response};
pub use crate::jobs::compute::{
    class, cost, default_class, names, of_job, Class, Rate, CLASSES, DEFAULT,
};
use crate::jobs::Money;
use serde_json::{json, Value};

/// The 400 for a name that is no class.
pub fn unknown(field: &str, name: &str) -> Response {
    error(
        400,
        &format!(
            "{field}: unknown compute class {name:?}; one of {}",
            names()
        ),
    )
}

/// The 403 for a class this server does not offer, and why (`Refused::why`).
pub fn not_offered(field: &str, r: &Refused) -> Response {
    let field = if r.by_default {
        "default_compute_class (yours, set with PUT /v1/compute/preferences; no compute_class was given)"
    } else {
        field
    };
    error(
        403,
        &format!(
            "{field}: {}; GET /v1/compute/preferences lists the classes offered",
            r.why
        ),
    )
}

/// A class this server does not offer, as a request resolved it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The class.
    pub class: &'static Class,
    /// It came from the tenant's default, not from the request.
    pub by_default: bool,
    /// Why it is not offered, in words.
    pub why: String,
}

/// Why this server does not offer class `c` (`None`: it does): the operator did not
/// list it, or it has more memory than a tenant may have at once, which no sandbox
/// or job of it could then get.
pub fn why_not_offered(c: &Class, listed: &[&str], max_mem_mb: u64) -> Option<String> {
    if !listed.contains(&c.name) {
        return Some(format!(
            "the {} class is not offered on this server (its operator sets ISOBOX_WBX_COMPUTE_CLASSES)",
            c.name
        ));
    }
    (c.mem_mb > max_mem_mb).then(|| {
        format!(
            "the {} class's {} MiB is more memory than a tenant may have at once on this server (ISOBOX_WBX_MAX_MEMORY_MB {max_mem_mb}), so it is not offered",
            c.name, c.mem_mb
        )
    })
}

/// `compute_class` of a request body, checked to be a class (whether it is offered is
/// the daemon's to say).
///
/// # Errors
/// 400 for a value that is not a class's name.
pub fn field(v: Option<&Value>) -> Result<Option<&'static Class>, Response> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => class(s)
            .filter(|_| !s.is_empty())
            .map(Some)
            .ok_or_else(|| unknown("compute_class", s)),
        Some(_) => Err(error(
            400,
            &format!("compute_class: a string, one of {}", names()),
        )),
    }
}

/// What `PUT /v1/compute/preferences` asks: the new default (`None`: back to the
/// server's, economy).
///
/// # Errors
/// 400 for anything but `{"default_compute_class": <a class, "" or null>}`.
pub fn preferences_put(req: &Request) -> Result<Option<&'static Class>, Response> {
    let f = super::sandboxes::Fields::of(req, &["default_compute_class"])?;
    match f.0.get("default_compute_class") {
        None => Err(error(
            400,
            &format!(
                "default_compute_class: required; one of {}, or \"\" for the server's default ({DEFAULT})",
                names()
            ),
        )),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => class(s)
            .map(Some)
            .ok_or_else(|| unknown("default_compute_class", s)),
        Some(_) => Err(error(
            400,
            &format!(
                "default_compute_class: a string, one of {}, or \"\"",
                names()
            ),
        )),
    }
}

/// A rate as the answers show it: `{"vcpu_s": "0.000010 EUR", "gb_s": …}`, every
/// decimal there is.
pub fn price_json(r: Rate, currency: &str) -> Value {
    let show = |m: i128| format!("{} {currency}", Money(m).display_price());
    json!({"vcpu_s": show(r.vcpu_s), "gb_s": show(r.gb_s)})
}

/// `GET /v1/compute/preferences`: the tenant's default, and every class with its
/// terms here, its price, and whether this server offers it (and why not).
pub fn preferences_json(
    default: &Class,
    not_offered: impl Fn(&Class) -> Option<String>,
    rate: impl Fn(&Class) -> Rate,
    currency: &str,
) -> Value {
    let classes: Vec<Value> = CLASSES
        .iter()
        .map(|c| {
            let r = rate(c);
            let why = not_offered(c);
            json!({
                "name": c.name,
                "offered": why.is_none(),
                "why_not_offered": why,
                "vcpu": c.vcpu,
                "mem_mb": c.mem_mb,
                "cpu_weight": c.cpu_weight,
                "terms": c.terms,
                "price": price_json(r, currency),
            })
        })
        .collect();
    json!({
        "default_compute_class": default.name,
        "currency": currency,
        "classes": classes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_field_refuses_non_classes_by_name() {
        assert_eq!(field(None).unwrap(), None);
        assert_eq!(field(Some(&Value::Null)).unwrap(), None);
        assert_eq!(
            field(Some(&json!("memory"))).unwrap().map(|c| c.mem_mb),
            Some(8192)
        );
        for bad in [json!(""), json!("turbo"), json!(3), json!(["economy"])] {
            let r = field(Some(&bad)).unwrap_err();
            assert_eq!(r.status, 400, "{bad}");
        }
    }
}
