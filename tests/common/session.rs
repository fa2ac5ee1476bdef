//! Sessions (`POST /v1/sessions`, filesystem or kernel): what a test keeps of one, its
//! id and capability token, and the requests it then makes with them.

use super::sse::Stream;
use super::{Daemon, Resp};
use serde_json::{json, Value};

/// A session the daemon created.
#[derive(Debug, Clone)]
pub struct Session {
    pub id: String,
    pub token: String,
    /// The `201 Created` body (type, runtime, createdAt, volumeId, ...).
    pub created: Value,
    /// Sent with every request for the session besides its token: the headers it was
    /// created with (a tenant's API key; a session belongs to the tenant that made it).
    pub headers: Vec<(String, String)>,
}

impl Session {
    /// `POST /v1/sessions` with `body`; panics unless the answer is 201.
    pub fn create(d: &Daemon, body: &Value) -> Session {
        Self::create_with(d, &[], body)
    }

    /// An offline Python kernel session (`type: kernel`, `network: false`).
    pub fn kernel(d: &Daemon) -> Session {
        let s = Self::create(
            d,
            &json!({"runtime": "python", "type": "kernel", "network": false}),
        );
        let v = &s.created;
        assert_eq!(v["type"], "kernel", "{v}");
        assert_eq!(v["runtime"], "python", "{v}");
        s
    }

    /// [`create`](Self::create) with `headers` (an API key), which then go along with
    /// every request for the session.
    pub fn create_with(d: &Daemon, headers: &[(&str, &str)], body: &Value) -> Session {
        let mut h = vec![("Content-Type", "application/json")];
        h.extend_from_slice(headers);
        let r = d.request("POST", "/v1/sessions", &h, body.to_string().as_bytes());
        assert_eq!(
            r.status,
            201,
            "create a session {body}: {}\nlog:\n{}",
            r.text(),
            d.log()
        );
        let mut s = Self::from_created(r.json());
        s.headers = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        s
    }

    /// The session a `201` body describes (for a create sent some other way).
    pub fn from_created(created: Value) -> Session {
        Session {
            id: created["id"].as_str().expect("session id").to_string(),
            token: created["token"]
                .as_str()
                .expect("session token")
                .to_string(),
            created,
            headers: Vec::new(),
        }
    }

    /// A request to `/v1/sessions/<id><rest>` with `headers`, the session's own
    /// headers and its token.
    pub fn request(
        &self,
        d: &Daemon,
        method: &str,
        rest: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Resp {
        let mut h = headers.to_vec();
        h.extend(self.headers.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        h.push(("X-Session-Token", &self.token));
        d.request(method, &format!("/v1/sessions/{}{rest}", self.id), &h, body)
    }

    /// `POST /v1/sessions/<id>/exec` with a JSON body, whatever the answer.
    pub fn exec(&self, d: &Daemon, body: &Value) -> Resp {
        self.request(
            d,
            "POST",
            "/exec",
            &[("Content-Type", "application/json")],
            body.to_string().as_bytes(),
        )
    }

    /// A streamed step (SSE) with this body, read as it arrives.
    pub fn stream(&self, d: &Daemon, body: &Value) -> Stream {
        let mut h: Vec<(&str, &str)> = self
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        h.push(("X-Session-Token", &self.token));
        Stream::post(d, &format!("/v1/sessions/{}/exec", self.id), &h, body)
    }

    /// A step with exactly this body, which must be answered 200; its body.
    pub fn step_with(&self, d: &Daemon, body: &Value) -> Value {
        let r = self.exec(d, body);
        assert_eq!(
            r.status,
            200,
            "step {body}: {}\nlog:\n{}",
            r.text(),
            d.log()
        );
        r.json()
    }

    /// A step running `code` (`{"code": code}`), which must be answered 200; its body.
    pub fn step(&self, d: &Daemon, code: &str) -> Value {
        self.step_with(d, &json!({ "code": code }))
    }

    /// The file API: `/v1/sessions/<id>/fs?<query>`.
    pub fn fs(&self, d: &Daemon, method: &str, query: &str, body: &[u8]) -> Resp {
        self.request(d, method, &format!("/fs?{query}"), &[], body)
    }

    /// `DELETE /v1/sessions/<id>`, whatever the answer.
    pub fn delete(&self, d: &Daemon) -> Resp {
        self.request(d, "DELETE", "", &[], b"")
    }
}
