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
pub use crate::jobs::compute::{class, cost, default_class, names, Class, Rate, CLASSES, DEFAULT};
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

/// The 403 for a class this server does not offer.
pub fn not_offered(field: &str, c: &Class) -> Response {
    error(
        403,
        &format!(
            "{field}: the {} class is not offered on this server (its operator sets ISOBOX_WBX_COMPUTE_CLASSES); GET /v1/compute/preferences lists the classes offered",
            c.name
        ),
    )
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

/// `GET /v1/compute/preferences`: the tenant's default, and every class with its
/// terms here, its price, and whether this server offers it.
pub fn preferences_json(
    default: &Class,
    offered: &[&'static str],
    rate: impl Fn(&Class) -> Rate,
    currency: &str,
) -> Value {
    let show = |m: i128| format!("{} {currency}", Money(m).display_price());
    let classes: Vec<Value> = CLASSES
        .iter()
        .map(|c| {
            let r = rate(c);
            json!({
                "name": c.name,
                "offered": offered.contains(&c.name),
                "vcpu": c.vcpu,
                "mem_mb": c.mem_mb,
                "cpu_weight": c.cpu_weight,
                "terms": c.terms,
                "price": {"vcpu_s": show(r.vcpu_s), "gb_s": show(r.gb_s)},
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
