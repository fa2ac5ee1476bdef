//! `GET /v1/agent` (is the server-side agent on, and with which model) and
//! `POST /v1/agent` (check the request, then the reactor starts the loop).

use super::{Action, App};
use crate::http::{Request, Response};
use serde::Deserialize;
use serde_json::Value;

/// The kernel session a loop uses.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionRef {
    /// Session id.
    pub id: String,
    /// Its token.
    pub token: String,
}

/// A checked `POST /v1/agent`, for the reactor to start.
pub struct AgentStart {
    /// Tenant from admission.
    pub tenant: String,
    /// The kernel session (absent: the loop answers `session_required`).
    pub session: Option<SessionRef>,
    /// The conversation so far.
    pub messages: Vec<Value>,
    /// Model calls at most.
    pub max_iters: u32,
}

/// Messages in one request.
pub const MAX_MESSAGES: usize = 256;

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Body {
    messages: Vec<Value>,
    #[serde(default)]
    session: Option<SessionRef>,
    #[serde(default)]
    max_iters: Option<i64>,
}

/// Both methods of `/v1/agent`.
pub fn handle(app: &mut App, req: &Request) -> Action {
    let ai = &app.cfg.ai;
    if req.head.method != "POST" {
        let body = if ai.enabled() {
            serde_json::json!({"enabled": true, "model": ai.model})
        } else {
            serde_json::json!({"enabled": false})
        };
        return Action::Respond(Response::json(200, &body));
    }
    if !ai.enabled() {
        return Action::Respond(Response::error(
            501,
            "agent_disabled",
            Some("the server-side agent is off (set ISOBOX_AI_BASE and ISOBOX_AI_MODEL)"),
        ));
    }
    let body: Body = match super::decode_json(
        &req.body,
        &[
            (
                "messages",
                "a list of chat messages ({\"role\", \"content\"} objects)",
            ),
            (
                "session",
                "an object {\"id\", \"token\"} of a kernel session",
            ),
            ("session.id", "the session's id, a string"),
            ("session.token", "the session's token, a string"),
            ("maxIters", "a whole number of model calls"),
        ],
    ) {
        Ok(b) => b,
        Err(resp) => return Action::Respond(resp),
    };
    if let Err(why) = check_messages(&body.messages) {
        return Action::Respond(Response::error(400, "invalid_json", Some(&why)));
    }
    let max_iters = body.max_iters.map_or(ai.max_iters, |n| {
        u32::try_from(n.clamp(1, i64::from(ai.max_iters))).unwrap_or(ai.max_iters)
    });
    Action::Agent(Box::new(AgentStart {
        tenant: req.tenant.clone(),
        session: body.session,
        messages: body.messages,
        max_iters,
    }))
}

/// The conversation must be what an OpenAI-compatible endpoint takes: objects with a
/// known `role`; `content` a string (or null, or content parts, for an assistant).
fn check_messages(messages: &[Value]) -> Result<(), String> {
    if messages.is_empty() {
        return Err("messages: at least one message is required".into());
    }
    if messages.len() > MAX_MESSAGES {
        return Err(format!("messages: at most {MAX_MESSAGES}"));
    }
    for (i, m) in messages.iter().enumerate() {
        let Some(obj) = m.as_object() else {
            return Err(format!("messages[{i}]: an object is expected"));
        };
        let role = obj.get("role").and_then(Value::as_str).unwrap_or("");
        if !["system", "user", "assistant", "tool"].contains(&role) {
            return Err(format!(
                "messages[{i}].role: one of system, user, assistant, tool is expected"
            ));
        }
        match obj.get("content") {
            Some(Value::String(_) | Value::Array(_)) => {}
            Some(Value::Null) | None if role == "assistant" => {}
            _ => return Err(format!("messages[{i}].content: a string is expected")),
        }
        if role == "tool" && !obj.get("tool_call_id").is_some_and(Value::is_string) {
            return Err(format!("messages[{i}].tool_call_id: a string is expected"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn test_messages_checked() {
        assert!(check_messages(&[json!({"role":"user","content":"hi"})]).is_ok());
        assert!(check_messages(&[]).is_err());
        assert!(check_messages(&[json!("hi")]).is_err());
        assert!(check_messages(&[json!({"role":"root","content":"x"})]).is_err());
        assert!(check_messages(&[json!({"role":"user"})]).is_err());
        assert!(check_messages(&[json!({"role":"user","content":5})]).is_err());
        assert!(check_messages(&[json!({"role":"assistant","content":null})]).is_ok());
        assert!(check_messages(&[json!({"role":"tool","content":"x"})]).is_err());
        assert!(check_messages(&[json!({"role":"tool","content":"x","tool_call_id":"a"})]).is_ok());
        let many: Vec<Value> = (0..=MAX_MESSAGES)
            .map(|_| json!({"role":"user","content":"x"}))
            .collect();
        assert!(check_messages(&many).is_err());
        assert!(check_messages(&many[..MAX_MESSAGES]).is_ok());
    }
}
