//! The web UI's view of the protocol, generated from the same types: a JavaScript module of
//! constants (every fixed-value field's values, every message type) and `JSDoc` typedefs (every
//! message and record, from the JSON Schema), committed as
//! `crates/daemon/src/ui/assets/protocol.gen.js`. A test fails when the committed file differs
//! from what [`module`] generates (`DROVER_BLESS=1` regenerates it).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::Value;

use crate::values::WireEnum;
use crate::{
    AgentStatus, AttentionReason, CancelCause, ChangeStatus, Delivery, ErrorCode, HostState,
    InterruptCause, ItemKind, JobStatus, KillCause, NotifyEvent, PermissionPolicy, RuntimeState,
    ScheduleState, SignInState, SinkKind, SubagentVia, TurnEnd, WorkspaceActivity, WorkspaceKind,
};

/// The generated module's text.
pub fn module() -> String {
    let schema = crate::schema();
    let mut out = String::from(
        "// Generated from the Rust types of crates/protocol (drover_protocol::js): do not edit.\n\
         // Regenerate with: DROVER_BLESS=1 cargo test -p drover-protocol --test js\n\
         // @ts-check\n\n",
    );
    let _ = writeln!(
        out,
        "/** The protocol version `hello` names. */\nexport const PROTOCOL_VERSION = {};\n",
        crate::PROTOCOL_VERSION
    );
    constants(&mut out);
    message_types(&mut out, "ClientType", &schema["client"]);
    message_types(&mut out, "DaemonType", &schema["daemon"]);
    typedefs(&mut out, &schema);
    out
}

/// One frozen object per fixed-value field: `AgentStatus.Idle === 'idle'`.
fn constants(out: &mut String) {
    enum_constant::<ErrorCode>(out);
    enum_constant::<AgentStatus>(out);
    enum_constant::<AttentionReason>(out);
    enum_constant::<RuntimeState>(out);
    enum_constant::<HostState>(out);
    enum_constant::<WorkspaceKind>(out);
    enum_constant::<WorkspaceActivity>(out);
    enum_constant::<JobStatus>(out);
    enum_constant::<KillCause>(out);
    enum_constant::<ScheduleState>(out);
    enum_constant::<SignInState>(out);
    enum_constant::<ChangeStatus>(out);
    enum_constant::<SinkKind>(out);
    enum_constant::<NotifyEvent>(out);
    enum_constant::<SubagentVia>(out);
    enum_constant::<ItemKind>(out);
    enum_constant::<TurnEnd>(out);
    enum_constant::<CancelCause>(out);
    enum_constant::<InterruptCause>(out);
    let delivery = [Delivery::Followup, Delivery::Steer, Delivery::Inject];
    serde_constant(out, "Delivery", &delivery);
    serde_constant(
        out,
        "PermissionPolicy",
        &[PermissionPolicy::Ask, PermissionPolicy::Allow],
    );
}

fn enum_constant<E: WireEnum>(out: &mut String) {
    let pairs: Vec<(String, String)> = E::ALL
        .iter()
        .zip(E::NAMES)
        .map(|(v, name)| ((*name).to_string(), v.as_str().to_string()))
        .collect();
    write_constant(out, E::NAME, &pairs);
}

fn serde_constant<T: serde::Serialize + std::fmt::Debug>(out: &mut String, name: &str, all: &[T]) {
    let pairs: Vec<(String, String)> = all
        .iter()
        .map(|v| {
            let wire = serde_json::to_value(v)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default();
            (format!("{v:?}"), wire)
        })
        .collect();
    write_constant(out, name, &pairs);
}

fn write_constant(out: &mut String, name: &str, pairs: &[(String, String)]) {
    let _ = writeln!(out, "/** Every `{name}` value, by its Rust name. */");
    let _ = writeln!(out, "export const {name} = Object.freeze({{");
    for (key, wire) in pairs {
        let _ = writeln!(out, "  {key}: /** @type {{'{wire}'}} */ ('{wire}'),");
    }
    out.push_str("});\n\n");
}

/// Every message type of one direction, by its Rust variant name: `DaemonType.AgentStatus`.
fn message_types(out: &mut String, name: &str, root: &Value) {
    let mut pairs = Vec::new();
    for variant in root["oneOf"].as_array().into_iter().flatten() {
        if let Some(wire) = variant["properties"]["type"]["const"].as_str() {
            pairs.push((pascal(wire), wire.to_string()));
        }
    }
    write_constant(out, name, &pairs);
}

fn pascal(snake: &str) -> String {
    snake
        .split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

/// A `JSDoc` typedef for every record of the schema, and for both directions' messages.
fn typedefs(out: &mut String, schema: &Value) {
    let mut defs: BTreeMap<String, Value> = BTreeMap::new();
    for section in ["client", "daemon"] {
        if let Some(d) = schema[section]["$defs"].as_object() {
            for (k, v) in d {
                defs.insert(k.clone(), v.clone());
            }
        }
    }
    for (name, def) in &defs {
        typedef(out, name, def);
    }
    if let Some(timeline) = schema["timeline"].as_object() {
        for root in timeline.values() {
            if let Some(title) = root["title"].as_str()
                && !defs.contains_key(title)
            {
                typedef(out, title, root);
            }
        }
    }
    typedef(out, "ClientRequest", &schema["client"]);
    typedef(out, "DaemonMessage", &schema["daemon"]);
    // The request a caller builds: the envelope without its `requestId` (the connection adds
    // it).
    let mut message = schema["client"].clone();
    if let Some(o) = message.as_object_mut() {
        o.remove("properties");
        o.remove("type");
        o.remove("description");
    }
    typedef(out, "ClientMessage", &message);
}

fn typedef(out: &mut String, name: &str, schema: &Value) {
    out.push_str("/**\n");
    if let Some(doc) = schema["description"].as_str() {
        let _ = writeln!(out, "{}", comment(doc));
    }
    let plain_object = schema["type"] == "object"
        && schema["properties"].is_object()
        && ["oneOf", "anyOf", "allOf", "$ref"]
            .iter()
            .all(|k| schema.get(k).is_none());
    if !plain_object {
        let _ = writeln!(out, " * @typedef {{{}}} {name}\n */\n", ts(schema, " *"));
        return;
    }
    let _ = writeln!(out, " * @typedef {{Object}} {name}");
    let required: Vec<&str> = schema["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for (key, value) in schema["properties"].as_object().into_iter().flatten() {
        let key = if required.contains(&key.as_str()) {
            key.clone()
        } else {
            format!("[{key}]")
        };
        let doc = value["description"]
            .as_str()
            .map(|d| {
                format!(
                    " - {}",
                    d.split("\n\n").next().unwrap_or(d).replace('\n', " ")
                )
            })
            .unwrap_or_default()
            .replace("*/", "*\\/");
        let _ = writeln!(out, " * @property {{{}}} {key}{doc}", ts(value, " *"));
    }
    out.push_str(" */\n\n");
}

/// `doc` as `JSDoc` comment lines.
fn comment(doc: &str) -> String {
    doc.lines()
        .map(|l| {
            format!(" * {}", l.replace("*/", "*\\/"))
                .trim_end()
                .to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The TypeScript type (as `JSDoc` reads it) of one JSON Schema. `indent` prefixes the lines of
/// a multi-line object type.
fn ts(schema: &Value, indent: &str) -> String {
    let Some(o) = schema.as_object() else {
        return if schema == &Value::Bool(false) {
            "never".to_string()
        } else {
            "any".to_string()
        };
    };
    let mut parts = Vec::new();
    if let Some(r) = o.get("$ref").and_then(Value::as_str) {
        parts.push(r.rsplit('/').next().unwrap_or(r).to_string());
    }
    if let Some(c) = o.get("const") {
        parts.push(c.to_string().replace('"', "'"));
    } else if let Some(values) = o.get("enum").and_then(Value::as_array) {
        parts.push(union(
            values
                .iter()
                .map(|v| v.to_string().replace('"', "'"))
                .collect(),
        ));
    } else if let Some(t) = o.get("type") {
        parts.push(by_type(o, t, indent));
    }
    for key in ["oneOf", "anyOf"] {
        if let Some(members) = o.get(key).and_then(Value::as_array) {
            parts.push(union(members.iter().map(|m| ts(m, indent)).collect()));
        }
    }
    if let Some(members) = o.get("allOf").and_then(Value::as_array) {
        parts.extend(members.iter().map(|m| ts(m, indent)));
    }
    match parts.len() {
        0 => "any".to_string(),
        1 => parts.remove(0),
        _ => parts
            .into_iter()
            .map(|p| format!("({p})"))
            .collect::<Vec<_>>()
            .join(" & "),
    }
}

fn union(members: Vec<String>) -> String {
    let mut seen: Vec<String> = Vec::new();
    for m in members {
        if !seen.contains(&m) {
            seen.push(m);
        }
    }
    if seen.len() == 1 {
        return seen.remove(0);
    }
    seen.iter()
        .map(|m| {
            if m.contains(" & ") {
                format!("({m})")
            } else {
                m.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

fn by_type(o: &serde_json::Map<String, Value>, t: &Value, indent: &str) -> String {
    if let Some(types) = t.as_array() {
        let members = types
            .iter()
            .map(|one| by_type(o, one, indent))
            .collect::<Vec<_>>();
        return union(members);
    }
    match t.as_str().unwrap_or_default() {
        "string" => "string".to_string(),
        "integer" | "number" => "number".to_string(),
        "boolean" => "boolean".to_string(),
        "null" => "null".to_string(),
        "array" => match o.get("items") {
            Some(items) => format!("Array<{}>", ts(items, indent)),
            None => "Array<any>".to_string(),
        },
        "object" => object(o, indent),
        _ => "any".to_string(),
    }
}

fn object(o: &serde_json::Map<String, Value>, indent: &str) -> String {
    let Some(properties) = o.get("properties").and_then(Value::as_object) else {
        return match o.get("additionalProperties") {
            Some(v) if v.is_object() => format!("{{[key: string]: {}}}", ts(v, indent)),
            _ => "{[key: string]: any}".to_string(),
        };
    };
    let required: Vec<&str> = o
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let inner = format!("{indent}  ");
    let mut s = String::from("{\n");
    for (key, value) in properties {
        let optional = if required.contains(&key.as_str()) {
            ""
        } else {
            "?"
        };
        let _ = writeln!(s, "{inner}{key}{optional}: {},", ts(value, &inner));
    }
    let _ = write!(s, "{indent}}}");
    s
}
