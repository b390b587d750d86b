//! Typed results and review as the API takes them: a result schema and
//! review terms checked at create, a worker's result checked against its
//! task's schema, and the agent's answer to a submission.

use meatspace_api_types::{ReviewAction, ReviewAnswer, ReviewTerms};
use meatspace_domain::result::{FieldError, ResultSchema};
use meatspace_domain::{EventType, MAX_TEXT_CHARS, Review, Verdict};
use uuid::Uuid;

use super::checked_optional_text;
use crate::AppState;
use crate::http::error::ApiError;

/// Most events read to find the photos of an assignment (a feed holds at
/// most `limits.events_per_task`; this bounds one page).
const PAGE: u32 = 500;

/// `result_schema` of a create, checked to be in the subset: 422 with the
/// JSON pointer of each unsupported part otherwise. The schema is stored
/// as the server reads it (`additionalProperties` set to `false`).
pub(crate) fn checked_schema(
    schema: Option<serde_json::Value>,
) -> Result<Option<serde_json::Value>, ApiError> {
    let Some(schema) = schema else {
        return Ok(None);
    };
    let parsed = ResultSchema::parse(&schema).map_err(|errors| {
        refused(
            "invalid-result-schema",
            "result_schema is outside the supported subset",
            errors,
        )
    })?;
    Ok(Some(parsed.as_json().clone()))
}

/// `review` of a create: the terms, with the default delay when none was
/// given; 422 with the bounds when the delay is outside them.
pub(crate) fn checked_review(terms: Option<ReviewTerms>) -> Result<Option<Review>, ApiError> {
    terms
        .map(|t| {
            Review::requested(t.auto_accept_seconds).map_err(|(min, max)| {
                ApiError::invalid(format!(
                    "review.auto_accept_seconds must be between {min} and {max}"
                ))
            })
        })
        .transpose()
}

/// The agent's answer as the domain's verdict. A missing text is the
/// domain's to refuse, after it has checked the task's state (a terminal
/// task answers 409 whatever the body says); a text is checked here.
pub(crate) fn verdict(answer: ReviewAnswer) -> Result<Verdict, ApiError> {
    let text = checked_optional_text("text", answer.text.as_deref(), MAX_TEXT_CHARS)?;
    Ok(match answer.action {
        ReviewAction::Accept if text.is_some() => {
            return Err(ApiError::invalid(
                "accept takes no text: what counts is the worker's submission",
            ));
        }
        ReviewAction::Accept => Verdict::Accept,
        ReviewAction::Revise => Verdict::Revise {
            text: text.unwrap_or_default(),
        },
        ReviewAction::Reject => Verdict::Reject {
            reason: text.unwrap_or_default(),
        },
    })
}

/// Checks `result` against the result schema of task `id`, as `worker`
/// sends it: 422 with each error at its pointer. Photo fields must name
/// photos this worker sent for this task during its assignment. A task
/// without a schema is left to the engine, which refuses the result.
pub(crate) async fn check(
    state: &AppState,
    id: Uuid,
    worker: Uuid,
    result: &serde_json::Value,
) -> Result<(), ApiError> {
    let task = state
        .store
        .task(id)
        .await?
        .filter(|t| t.worker_id == Some(worker))
        .ok_or_else(ApiError::task_not_found)?;
    let Some(schema) = &task.result_schema else {
        return Ok(());
    };
    let schema = ResultSchema::parse(schema)
        .map_err(|e| ApiError::Internal(anyhow::anyhow!("stored result schema: {e:?}")))?;
    let photos = assignment_photos(state, worker, id).await?;
    schema.check(result, &photos).map_err(|errors| {
        refused(
            "invalid-result",
            "the result does not match the task's result_schema",
            errors,
        )
    })
}

/// Ids of the photos `worker` sent for task `id` during its assignment,
/// oldest first, read from the feed it may see.
pub(crate) async fn assignment_photos(
    state: &AppState,
    worker: Uuid,
    id: Uuid,
) -> Result<Vec<Uuid>, ApiError> {
    let view = super::events::worker_view(state.store.as_ref(), worker, id).await?;
    let mut photos = Vec::new();
    let mut after = view.floor();
    loop {
        let page = state.store.events(id, after, PAGE).await?;
        let Some(last) = page.last() else {
            return Ok(photos);
        };
        after = last.id;
        photos.extend(
            page.iter()
                .filter(|e| e.kind == EventType::WorkerPhoto)
                .filter_map(|e| e.data.get("photo_id")?.as_str()?.parse::<Uuid>().ok()),
        );
        if page.len() < PAGE as usize {
            return Ok(photos);
        }
    }
}

fn refused(slug: &'static str, detail: &str, errors: Vec<FieldError>) -> ApiError {
    let n = errors.len();
    ApiError::InvalidFields {
        slug,
        detail: format!(
            "{detail}: {n} error{} (see `errors`, each at its JSON pointer)",
            if n == 1 { "" } else { "s" }
        ),
        errors,
    }
}
