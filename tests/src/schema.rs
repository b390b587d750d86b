//! JSON Schema checks for the suites that hold what the server sends or
//! accepts against the schemas it publishes (the OpenAPI document's events,
//! the MCP tools' input schemas).

use serde_json::Value;

/// The validator of `schema` (JSON Schema 2020-12), formats checked too.
pub fn validator(schema: &Value) -> jsonschema::Validator {
    jsonschema::options()
        .should_validate_formats(true)
        .build(schema)
        .unwrap_or_else(|e| panic!("not a schema: {e}"))
}

/// Why `value` does not match `validator`, every error with where it is;
/// `None` when it matches.
pub fn mismatch(validator: &jsonschema::Validator, value: &Value) -> Option<String> {
    let errors: Vec<String> = validator
        .iter_errors(value)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect();
    (!errors.is_empty()).then(|| errors.join("; "))
}
