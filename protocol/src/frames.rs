//! JSON frames on the WebSocket (reference §1.2–§1.3): parsing and checking
//! inbound text, and building outbound responses and signals. Nesting depth
//! is bounded by `serde_json`'s recursion limit (128 levels), so a deeply
//! nested frame is a 400, never a stack overflow.

use serde::Serialize;
use serde_json::{Map, Value};

use crate::error::{FrameError, WireError};

/// The id used in replies to frames whose own id could not be read.
pub const UNKNOWN_ID: &str = "?";

/// A checked inbound frame.
#[derive(Debug, Clone, PartialEq)]
pub enum Inbound {
    Req {
        id: String,
        call: String,
        args: Map<String, Value>,
    },
    Res {
        id: String,
        ok: bool,
        frame: Value,
    },
    Sig {
        signal: String,
        payload: Value,
    },
}

/// Parses one text message. The error is always answered with id `"?"`.
pub fn parse(text: &str) -> Result<Inbound, FrameError> {
    let v: Value = serde_json::from_str(text).map_err(|_| FrameError::MalformedJson)?;
    let Value::Object(mut o) = v else {
        return Err(FrameError::MalformedJson);
    };
    let ty = o.get("type").and_then(Value::as_str).unwrap_or_default();
    match ty {
        "req" => {
            let id = take_string(&mut o, "id")
                .ok_or(FrameError::InvalidFrame("req needs a string id"))?;
            let call = take_string(&mut o, "call")
                .ok_or(FrameError::InvalidFrame("req needs a string call"))?;
            let args = match o.remove("args") {
                None | Some(Value::Null) => Map::new(),
                Some(Value::Object(a)) => a,
                Some(_) => return Err(FrameError::InvalidFrame("req args must be an object")),
            };
            if o.contains_key("body") {
                return Err(FrameError::InvalidFrame(
                    "request bodies are not supported yet",
                ));
            }
            Ok(Inbound::Req { id, call, args })
        }
        "res" => {
            let id = o
                .get("id")
                .and_then(Value::as_str)
                .ok_or(FrameError::InvalidFrame("res needs a string id"))?
                .to_owned();
            let ok = o
                .get("ok")
                .and_then(Value::as_bool)
                .ok_or(FrameError::InvalidFrame("res needs a boolean ok"))?;
            Ok(Inbound::Res {
                id,
                ok,
                frame: Value::Object(o),
            })
        }
        "sig" => {
            if o.contains_key("body") {
                return Err(FrameError::InvalidFrame("signals cannot carry bodies"));
            }
            let signal = take_string(&mut o, "signal")
                .ok_or(FrameError::InvalidFrame("sig needs a string signal"))?;
            Ok(Inbound::Sig {
                signal,
                payload: o.remove("payload").unwrap_or(Value::Null),
            })
        }
        _ => Err(FrameError::InvalidFrame("type must be req, res or sig")),
    }
}

fn take_string(o: &mut Map<String, Value>, key: &str) -> Option<String> {
    match o.remove(key) {
        Some(Value::String(s)) => Some(s),
        _ => None,
    }
}

/// An outbound frame.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Outbound {
    Res(Response),
    Sig {
        signal: String,
        payload: Value,
        #[serde(skip_serializing_if = "Option::is_none")]
        seq: Option<u64>,
    },
}

/// A response frame (`ok:true` with `data`, or `ok:false` with `error`).
#[derive(Debug, Clone, Serialize)]
pub struct Response {
    pub id: String,
    pub ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<WireError>,
}

impl Response {
    pub fn ok(id: impl Into<String>, data: Value) -> Response {
        Response {
            id: id.into(),
            ok: true,
            data: Some(data),
            error: None,
        }
    }

    pub fn err(id: impl Into<String>, e: impl Into<WireError>) -> Response {
        Response {
            id: id.into(),
            ok: false,
            data: None,
            error: Some(e.into()),
        }
    }

    pub fn from_result<E: Into<WireError>>(id: impl Into<String>, r: Result<Value, E>) -> Response {
        match r {
            Ok(v) => Response::ok(id, v),
            Err(e) => Response::err(id, e),
        }
    }
}

impl Outbound {
    pub fn to_text(&self) -> String {
        // Serialising plain `Value`s and strings cannot fail.
        serde_json::to_string(self).expect("frames serialise")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_frame_parses_with_empty_args_when_none_are_given() {
        let f = parse(r#"{"type":"req","id":"1","call":"sys.connect"}"#).unwrap();
        assert_eq!(
            f,
            Inbound::Req {
                id: "1".into(),
                call: "sys.connect".into(),
                args: Map::new()
            }
        );
    }

    #[test]
    fn malformed_and_non_object_json_are_malformed_json() {
        assert!(matches!(parse("{nope"), Err(FrameError::MalformedJson)));
        assert!(matches!(parse("[1,2]"), Err(FrameError::MalformedJson)));
    }

    #[test]
    fn frames_missing_their_required_fields_are_invalid() {
        for bad in [
            r#"{"type":"req","call":"x"}"#,
            r#"{"type":"req","id":7,"call":"x"}"#,
            r#"{"type":"res","id":"1"}"#,
            r#"{"type":"sig"}"#,
            r#"{"type":"sig","signal":"a","body":{}}"#,
            r#"{"type":"what"}"#,
        ] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.code(), 400, "{bad}");
        }
    }

    #[test]
    fn deeply_nested_json_is_refused_not_overflowed() {
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let text = format!(r#"{{"type":"req","id":"1","call":"x","args":{{"a":{deep}}}}}"#);
        assert!(matches!(parse(&text), Err(FrameError::MalformedJson)));
    }
}
