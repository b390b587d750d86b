//! A structural JSON Schema check for the suites that hold what the server
//! sends or accepts against the schemas it publishes (the OpenAPI
//! document's events, the MCP tools' input schemas).

use serde_json::Value;
use uuid::Uuid;

/// The schema `schema` stands for: the target of its `$ref` (or of a bare
/// reference string, as a discriminator's mapping holds) in `root`, or
/// itself.
pub fn resolve<'a>(schema: &'a Value, root: &'a Value) -> &'a Value {
    match schema.as_str().or_else(|| schema["$ref"].as_str()) {
        Some(reference) => reference
            .strip_prefix('#')
            .and_then(|p| root.pointer(p))
            .unwrap_or_else(|| panic!("unresolvable reference {reference}")),
        None => schema,
    }
}

/// Checks `value` against `schema` (references resolved in `root`): types
/// (with null), required and unknown (`additionalProperties: false`)
/// properties, enums and consts, formats of ids and times, numeric bounds,
/// string lengths, `oneOf` matching exactly one branch and `anyOf` at least
/// one.
pub fn validate(schema: &Value, value: &Value, root: &Value) -> Result<(), String> {
    if schema.get("$ref").is_some() {
        return validate(resolve(schema, root), value, root);
    }
    if let Some(options) = schema["oneOf"].as_array() {
        let matching = options
            .iter()
            .filter(|s| validate(s, value, root).is_ok())
            .count();
        if matching != 1 {
            let why: Vec<String> = options
                .iter()
                .filter_map(|s| validate(s, value, root).err())
                .collect();
            return Err(format!("matches {matching} branches of oneOf: {why:?}"));
        }
    }
    if let Some(options) = schema["anyOf"].as_array()
        && !options.iter().any(|s| validate(s, value, root).is_ok())
    {
        return Err(format!("{value} matches none of anyOf"));
    }
    if let Some(c) = schema.get("const")
        && c != value
    {
        return Err(format!("{value} is not {c}"));
    }
    if let Some(options) = schema["enum"].as_array()
        && !options.contains(value)
    {
        return Err(format!("{value} is not one of {options:?}"));
    }
    let types: Vec<&str> = match &schema["type"] {
        Value::String(t) => vec![t.as_str()],
        Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    };
    if !types.is_empty() && !types.iter().any(|t| is_of_type(value, t)) {
        return Err(format!("{value} is not of type {types:?}"));
    }
    if let Some(s) = value.as_str() {
        match schema["format"].as_str() {
            Some("uuid") if s.parse::<Uuid>().is_err() => return Err(format!("{s} is no uuid")),
            Some("date-time") if chrono::DateTime::parse_from_rfc3339(s).is_err() => {
                return Err(format!("{s} is no date-time"));
            }
            _ => {}
        }
        let n = s.chars().count() as u64;
        if schema["minLength"].as_u64().is_some_and(|m| n < m)
            || schema["maxLength"].as_u64().is_some_and(|m| n > m)
        {
            return Err(format!("{s:?} has a length out of bounds"));
        }
    }
    if let Some(n) = value.as_f64()
        && (schema["minimum"].as_f64().is_some_and(|m| n < m)
            || schema["maximum"].as_f64().is_some_and(|m| n > m))
    {
        return Err(format!("{n} is out of bounds"));
    }
    if let Value::Object(map) = value {
        for required in schema["required"].as_array().into_iter().flatten() {
            let name = required.as_str().expect("a required property's name");
            if !map.contains_key(name) {
                return Err(format!("missing required property {name}"));
            }
        }
        for (k, v) in map {
            match schema["properties"].get(k) {
                Some(s) => validate(s, v, root).map_err(|e| format!("{k}: {e}"))?,
                None if schema["additionalProperties"] == false => {
                    return Err(format!("unknown property {k}"));
                }
                None => {}
            }
        }
    }
    Ok(())
}

fn is_of_type(value: &Value, ty: &str) -> bool {
    match ty {
        "object" => value.is_object(),
        "string" => value.is_string(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        "boolean" => value.is_boolean(),
        "array" => value.is_array(),
        "null" => value.is_null(),
        _ => false,
    }
}
