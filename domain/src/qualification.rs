//! Who may do a task: the qualifications operators grant workers, and the
//! requirements an agent sets on a task. A worker who does not meet every
//! requirement of a task never sees it, cannot open it and cannot claim it;
//! a worker who loses a qualification while assigned keeps the assignment
//! (requirements decide who may take a task, not who may finish it).
//!
//! The language of requirements is small: for one named qualification,
//! `exists` (the bare requirement), `equals` a value, `in` a set of values,
//! `at_least` / `at_most` an integer. All requirements of a task must hold.
//! An expired grant counts as absent.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Characters of a qualification's name, at most.
pub const MAX_NAME_CHARS: usize = 100;
/// Characters of a text value, at most.
pub const MAX_VALUE_CHARS: usize = 200;
/// Requirements of one task, at most.
pub const MAX_REQUIREMENTS: usize = 20;
/// Values of one `in` set, at most.
pub const MAX_IN_VALUES: usize = 50;

/// A qualification's value: a text (`de`, `car`) or an integer (a level).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(untagged)]
pub enum QualificationValue {
    Integer(i64),
    Text(String),
}

/// A qualification an operator granted a worker.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct Qualification {
    /// Its name, e.g. `language:de`, `vehicle`, `level`.
    pub name: String,
    pub value: Option<QualificationValue>,
    pub granted_at: DateTime<Utc>,
    /// When the grant lapses; it counts as absent from then on.
    pub expires_at: Option<DateTime<Utc>>,
}

impl Qualification {
    /// Whether the grant still holds at `now`.
    pub fn holds(&self, now: DateTime<Utc>) -> bool {
        self.expires_at.is_none_or(|e| now < e)
    }
}

/// One requirement of a task: a named qualification, and what its value
/// must be (nothing more: the worker must hold it).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Requirement {
    /// The qualification's name.
    pub qualification: String,
    /// Its value must be exactly this.
    pub equals: Option<QualificationValue>,
    /// Its value must be one of these.
    #[serde(rename = "in")]
    pub one_of: Option<Vec<QualificationValue>>,
    /// Its value must be an integer at least this.
    pub at_least: Option<i64>,
    /// Its value must be an integer at most this.
    pub at_most: Option<i64>,
}

impl Requirement {
    /// The bare requirement: the worker holds `name`.
    pub fn exists(name: impl Into<String>) -> Requirement {
        Requirement {
            qualification: name.into(),
            equals: None,
            one_of: None,
            at_least: None,
            at_most: None,
        }
    }

    /// Whether a worker holding `held` (its grants, expired ones included)
    /// meets this requirement at `now`.
    pub fn met_by(&self, held: &[Qualification], now: DateTime<Utc>) -> bool {
        held.iter()
            .filter(|q| q.name == self.qualification && q.holds(now))
            .any(|q| self.accepts(q.value.as_ref()))
    }

    fn accepts(&self, value: Option<&QualificationValue>) -> bool {
        let integer = match value {
            Some(QualificationValue::Integer(n)) => Some(*n),
            _ => None,
        };
        self.equals.as_ref().is_none_or(|e| value == Some(e))
            && self
                .one_of
                .as_ref()
                .is_none_or(|set| value.is_some_and(|v| set.contains(v)))
            && self
                .at_least
                .is_none_or(|min| integer.is_some_and(|n| n >= min))
            && self
                .at_most
                .is_none_or(|max| integer.is_some_and(|n| n <= max))
    }
}

/// Whether a worker holding `held` meets every requirement at `now`.
pub fn all_met(requirements: &[Requirement], held: &[Qualification], now: DateTime<Utc>) -> bool {
    requirements.iter().all(|r| r.met_by(held, now))
}

/// Checks a qualification's name: 1 to [`MAX_NAME_CHARS`] characters of
/// lowercase letters, digits and `: . _ -`.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.chars().count() <= MAX_NAME_CHARS
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || ":._-".contains(c));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "a qualification name is 1 to {MAX_NAME_CHARS} characters of lowercase letters, \
             digits and : . _ - (got {name:?})"
        ))
    }
}

/// Checks a value: a text of 1 to [`MAX_VALUE_CHARS`] characters, or any
/// integer.
pub fn check_value(value: &QualificationValue) -> Result<(), String> {
    match value {
        QualificationValue::Text(t)
            if t.trim().is_empty() || t.chars().count() > MAX_VALUE_CHARS =>
        {
            Err(format!(
                "a qualification's text value is 1 to {MAX_VALUE_CHARS} characters"
            ))
        }
        _ => Ok(()),
    }
}

/// Checks a task's requirements: at most [`MAX_REQUIREMENTS`], each naming
/// a valid qualification with at most one of `equals` and `in` (of at most
/// [`MAX_IN_VALUES`] values), and bounds only where they can hold
/// together. The message names the requirement by its index.
pub fn check_requirements(requirements: &[Requirement]) -> Result<(), String> {
    if requirements.len() > MAX_REQUIREMENTS {
        return Err(format!(
            "requirements: at most {MAX_REQUIREMENTS} (got {})",
            requirements.len()
        ));
    }
    for (i, r) in requirements.iter().enumerate() {
        let at = |m: String| format!("requirements[{i}]: {m}");
        check_name(&r.qualification).map_err(at)?;
        if r.equals.is_some() && r.one_of.is_some() {
            return Err(at("give equals or in, not both".into()));
        }
        if let Some(set) = &r.one_of {
            if set.is_empty() || set.len() > MAX_IN_VALUES {
                return Err(at(format!("in holds 1 to {MAX_IN_VALUES} values")));
            }
            set.iter().try_for_each(check_value).map_err(at)?;
        }
        if let Some(v) = &r.equals {
            check_value(v).map_err(at)?;
        }
        if let (Some(min), Some(max)) = (r.at_least, r.at_most)
            && min > max
        {
            return Err(at(format!(
                "at_least {min} is above at_most {max}: nobody could meet it"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use QualificationValue::{Integer, Text};

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + secs, 0).expect("time")
    }

    fn grant(name: &str, value: Option<QualificationValue>) -> Qualification {
        Qualification {
            name: name.into(),
            value,
            granted_at: at(0),
            expires_at: None,
        }
    }

    #[test]
    fn each_operator_holds_where_it_should() {
        let held = [
            grant("vehicle", Some(Text("car".into()))),
            grant("level", Some(Integer(3))),
            grant("first_aid", None),
        ];
        let req = |json: serde_json::Value| -> Requirement {
            serde_json::from_value(json).expect("a requirement")
        };
        let met = |r: serde_json::Value| req(r).met_by(&held, at(1));
        assert!(met(serde_json::json!({ "qualification": "first_aid" })));
        assert!(!met(serde_json::json!({ "qualification": "language:de" })));
        assert!(met(
            serde_json::json!({ "qualification": "vehicle", "equals": "car" })
        ));
        assert!(!met(
            serde_json::json!({ "qualification": "vehicle", "equals": "bike" })
        ));
        assert!(met(
            serde_json::json!({ "qualification": "vehicle", "in": ["van", "car"] })
        ));
        assert!(!met(
            serde_json::json!({ "qualification": "vehicle", "in": ["van"] })
        ));
        assert!(met(
            serde_json::json!({ "qualification": "level", "at_least": 3 })
        ));
        assert!(!met(
            serde_json::json!({ "qualification": "level", "at_least": 4 })
        ));
        assert!(met(
            serde_json::json!({ "qualification": "level", "at_least": 2, "at_most": 3 })
        ));
        assert!(!met(
            serde_json::json!({ "qualification": "level", "at_most": 2 })
        ));
        // Bounds need an integer; a text never meets them.
        assert!(!met(
            serde_json::json!({ "qualification": "vehicle", "at_least": 0 })
        ));
        assert!(met(
            serde_json::json!({ "qualification": "level", "equals": 3 })
        ));
        assert!(!met(
            serde_json::json!({ "qualification": "level", "equals": "3" })
        ));
    }

    #[test]
    fn an_expired_grant_counts_as_absent() {
        let mut q = grant("vehicle", None);
        q.expires_at = Some(at(10));
        let r = Requirement::exists("vehicle");
        assert!(r.met_by(std::slice::from_ref(&q), at(9)));
        assert!(!r.met_by(&[q], at(10)));
    }

    #[test]
    fn every_requirement_must_hold() {
        let held = [grant("a", None)];
        assert!(all_met(&[], &[], at(0)));
        assert!(all_met(&[Requirement::exists("a")], &held, at(0)));
        assert!(!all_met(
            &[Requirement::exists("a"), Requirement::exists("b")],
            &held,
            at(0)
        ));
    }

    #[test]
    fn requirements_are_checked_with_their_index() {
        let mut both = Requirement::exists("level");
        both.equals = Some(Integer(1));
        both.one_of = Some(vec![Integer(1)]);
        let err = check_requirements(&[Requirement::exists("ok"), both]).unwrap_err();
        assert!(
            err.starts_with("requirements[1]: give equals or in"),
            "{err}"
        );
        let err = check_requirements(&[Requirement::exists("Bad Name")]).unwrap_err();
        assert!(err.contains("lowercase"), "{err}");
        let mut upside_down = Requirement::exists("level");
        upside_down.at_least = Some(5);
        upside_down.at_most = Some(2);
        assert!(check_requirements(&[upside_down]).is_err());
        let many = vec![Requirement::exists("a"); MAX_REQUIREMENTS + 1];
        assert!(check_requirements(&many).is_err());
        assert!(
            serde_json::from_value::<Requirement>(
                serde_json::json!({ "qualification": "a", "more_than": 1 })
            )
            .is_err()
        );
    }
}
