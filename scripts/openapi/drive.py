"""Runs tasks through every operation of the API with a client generated
from its OpenAPI document (by openapi-python-client), so the document is
proved usable by a mainstream generator, photos included.

    python drive.py BASE_URL DEV_KEY CLIENT_PARENT_DIR

CLIENT_PARENT_DIR holds the generated package `meatspace_client`. Run by
scripts/openapi-check.sh; exits non-zero on the first broken promise.
"""

import io
import sys

BASE_URL, DEV_KEY, CLIENT_DIR = sys.argv[1:4]
sys.path.insert(0, CLIENT_DIR)

from PIL import Image  # noqa: E402

from meatspace_client import AuthenticatedClient, Client  # noqa: E402
from meatspace_client.api.agent import (  # noqa: E402
    cancel_task,
    capabilities,
    create_task,
    extend_task,
    get_photo,
    get_task,
    openapi,
    publish_task,
    respond_to_issue,
    review_submission,
    task_events,
)
from meatspace_client.api.worker import (  # noqa: E402
    claim,
    complete,
    list_open_tasks,
    raise_issue,
    register_worker,
    send_message,
    send_photo,
    start,
    stop,
    worker_get_task,
    worker_task_events,
)
from meatspace_client.models import (  # noqa: E402
    CreateTaskRequest,
    CreatedTask,
    EndRequest,
    EventPage,
    EventType,
    ExtendRequest,
    IssueAction,
    IssueKind,
    IssueRequest,
    MessageRequest,
    OpenTaskPage,
    Position,
    Problem,
    RegisterWorkerRequest,
    RegisteredWorker,
    RespondRequest,
    ReviewRequest,
    StartWork,
    Task,
    TaskChange,
    TaskResource,
    TaskState,
)
from meatspace_client.types import File  # noqa: E402

TIMEOUT = 30.0
STEPS = []


def ok(response, status, kind):
    """The parsed body of `response`, which must have `status` and parse as `kind`."""
    assert response.status_code == status, (
        f"expected {status}, got {response.status_code}: {response.content[:500]!r}"
    )
    assert isinstance(response.parsed, kind), f"expected {kind.__name__}, got {response.parsed!r}"
    return response.parsed


def step(name):
    STEPS.append(name)
    print(f"[drive] {name}", flush=True)


def dev_client():
    return AuthenticatedClient(
        base_url=BASE_URL,
        token=DEV_KEY,
        prefix="",
        auth_header_name="x-meatspace-dev-key",
        timeout=TIMEOUT,
        raise_on_unexpected_status=True,
    )


def bearer(token):
    return AuthenticatedClient(
        base_url=BASE_URL, token=token, timeout=TIMEOUT, raise_on_unexpected_status=True
    )


def new_task(dev, text):
    created = ok(
        create_task.sync_detailed(
            client=dev,
            body=CreateTaskRequest(description=text, expires_in_seconds=3600),
        ),
        201,
        CreatedTask,
    )
    assert created.task.state == TaskState.DRAFT
    assert created.agent_token.startswith("mst_")
    return created.task.id, bearer(created.agent_token)


def publish(agent, task_id):
    change = ok(publish_task.sync_detailed(task_id, client=agent), 200, TaskChange)
    assert change.task.state == TaskState.OPEN
    assert [e.type_ for e in change.events] == [EventType.TASK_PUBLISHED]


def small_jpeg():
    out = io.BytesIO()
    image = Image.new("RGB", (32, 24))
    image.putdata([(x * 8, y * 10, 128) for y in range(24) for x in range(32)])
    image.save(out, format="JPEG", quality=85)
    return out.getvalue()


def main():
    anonymous = Client(base_url=BASE_URL, timeout=TIMEOUT, raise_on_unexpected_status=True)
    dev = dev_client()

    step("capabilities")
    caps = capabilities.sync_detailed(client=anonymous)
    assert caps.status_code == 200, caps.status_code
    caps = caps.parsed.to_dict()
    assert caps["service"] == "meatspace", caps
    assert "image/jpeg" in caps["limits"]["photo_types"], caps["limits"]

    step("openapi")
    doc = openapi.sync_detailed(client=anonymous)
    assert doc.status_code == 200, doc.status_code
    assert doc.parsed.to_dict()["openapi"].startswith("3."), doc.content[:100]

    step("create task")
    task_id, agent = new_task(dev, "Photograph the notice board at the town hall")

    step("publish")
    publish(agent, task_id)

    step("get task")
    task = ok(get_task.sync_detailed(task_id, client=agent), 200, TaskResource)
    assert task.state == TaskState.OPEN and task.id == task_id

    step("events")
    page = ok(task_events.sync_detailed(task_id, client=agent, after=0), 200, EventPage)
    assert [e.type_ for e in page.events] == [EventType.TASK_PUBLISHED], page.events
    assert not page.terminal and not page.has_more
    cursor = page.next_cursor

    step("worker register")
    registered = ok(
        register_worker.sync_detailed(client=dev, body=RegisterWorkerRequest(name="Ada")),
        201,
        RegisteredWorker,
    )
    worker = bearer(registered.worker_token)

    step("worker list tasks")
    seen = []
    cursor_page = None
    while True:
        page_of_open = ok(
            list_open_tasks.sync_detailed(client=worker, limit=100, cursor=cursor_page),
            200,
            OpenTaskPage,
        )
        seen += [t.id for t in page_of_open.tasks]
        if not isinstance(page_of_open.next_cursor, str):
            break
        cursor_page = page_of_open.next_cursor
    assert task_id in seen, "the published task is not listed as open"

    step("worker get task")
    assert ok(worker_get_task.sync_detailed(task_id, client=worker), 200, Task).id == task_id

    step("claim")
    change = ok(claim.sync_detailed(task_id, client=worker), 200, TaskChange)
    assert change.task.state == TaskState.ASSIGNED
    assert change.task.worker_id == registered.worker.id

    step("start")
    position = Position(latitude=52.5163, longitude=13.3777, accuracy_m=12.0)
    change = ok(
        start.sync_detailed(task_id, client=worker, body=StartWork(position=position)),
        200,
        TaskChange,
    )
    assert change.task.state == TaskState.ACTIVE

    step("message")
    change = ok(
        send_message.sync_detailed(
            task_id, client=worker, body=MessageRequest(text="On my way to the town hall")
        ),
        200,
        TaskChange,
    )
    assert [e.type_ for e in change.events] == [EventType.WORKER_MESSAGE]

    step("photo upload")
    jpeg = small_jpeg()
    change = ok(
        send_photo.sync_detailed(
            task_id,
            client=worker,
            body=File(payload=io.BytesIO(jpeg), file_name="board.jpg", mime_type="image/jpeg"),
        ),
        200,
        TaskChange,
    )
    (photo_event,) = change.events
    assert photo_event.type_ == EventType.WORKER_PHOTO and photo_event.untrusted
    photo = photo_event.data.to_dict()
    assert (photo["width"], photo["height"]) == (32, 24), photo

    step("agent get photo")
    fetched = get_photo.sync_detailed(task_id, photo["photo_id"], client=agent)
    assert fetched.status_code == 200, fetched.content[:200]
    assert isinstance(fetched.parsed, File), fetched.parsed
    assert fetched.headers["content-type"] == "image/jpeg", fetched.headers
    with Image.open(fetched.parsed.payload) as img:
        assert (img.format, img.size) == ("JPEG", (32, 24)), (img.format, img.size)

    step("issue raise")
    change = ok(
        raise_issue.sync_detailed(
            task_id,
            client=worker,
            body=IssueRequest(kind=IssueKind.UNCLEAR_INSTRUCTIONS, text="Which notice board?"),
        ),
        200,
        TaskChange,
    )
    (issue_event,) = change.events
    assert issue_event.type_ == EventType.WORKER_ISSUE
    assert change.task.open_issues == 1

    step("agent respond")
    change = ok(
        respond_to_issue.sync_detailed(
            task_id,
            issue_event.id,
            client=agent,
            body=RespondRequest(action=IssueAction.CLARIFY, text="The one by the main door"),
        ),
        200,
        TaskChange,
    )
    assert [e.type_ for e in change.events] == [EventType.AGENT_ISSUE_RESPONSE]
    assert change.task.open_issues == 0

    step("worker events")
    page = ok(
        worker_task_events.sync_detailed(task_id, client=worker, after=0), 200, EventPage
    )
    assert [e.type_ for e in page.events] == [
        EventType.TASK_PUBLISHED,
        EventType.TASK_ASSIGNED,
        EventType.TASK_STARTED,
        EventType.WORKER_MESSAGE,
        EventType.WORKER_PHOTO,
        EventType.WORKER_ISSUE,
        EventType.AGENT_ISSUE_RESPONSE,
    ], [e.type_ for e in page.events]

    step("extend")
    change = ok(
        extend_task.sync_detailed(task_id, client=agent, body=ExtendRequest(add_seconds=60)),
        200,
        TaskChange,
    )
    assert change.events[-1].type_ == EventType.TASK_EXTENDED, change.events

    step("complete")
    change = ok(
        complete.sync_detailed(task_id, client=worker, body=EndRequest(text="Photo sent")),
        200,
        TaskChange,
    )
    assert change.task.state == TaskState.COMPLETED
    page = ok(
        task_events.sync_detailed(task_id, client=agent, after=cursor), 200, EventPage
    )
    assert page.terminal and page.task_state == TaskState.COMPLETED
    assert page.events[-1].type_ == EventType.TASK_COMPLETED

    # A terminal task refuses more work, as a problem document.
    refused = ok(start.sync_detailed(task_id, client=worker, body=None), 409, Problem)
    assert refused.task_state == TaskState.COMPLETED, refused

    step("cancel (second task)")
    second, second_agent = new_task(dev, "Check the opening hours of the library")
    publish(second_agent, second)
    change = ok(cancel_task.sync_detailed(second, client=second_agent), 200, TaskChange)
    assert change.task.state == TaskState.CANCELLED

    step("stop (third task)")
    third, third_agent = new_task(dev, "Count the benches in the park")
    publish(third_agent, third)
    ok(claim.sync_detailed(third, client=worker), 200, TaskChange)
    change = ok(stop.sync_detailed(third, client=worker, body=None), 200, TaskChange)
    assert change.task.state == TaskState.STOPPED
    assert ok(get_task.sync_detailed(third, client=third_agent), 200, TaskResource).state == (
        TaskState.STOPPED
    )

    step("typed result and review (fourth task)")
    body = CreateTaskRequest.from_dict(
        {
            "description": "Check whether the gate is locked",
            "result_schema": {
                "type": "object",
                "properties": {"locked": {"type": "boolean", "title": "Locked?"}},
                "required": ["locked"],
            },
            "review": {"auto_accept_seconds": 3600},
        }
    )
    created = ok(create_task.sync_detailed(client=dev, body=body), 201, CreatedTask)
    fourth, fourth_agent = created.task.id, bearer(created.agent_token)
    publish(fourth_agent, fourth)
    ok(claim.sync_detailed(fourth, client=worker), 200, TaskChange)
    ok(start.sync_detailed(fourth, client=worker, body=None), 200, TaskChange)
    wrong = EndRequest.from_dict({"result": {"locked": "yes"}})
    refused = ok(complete.sync_detailed(fourth, client=worker, body=wrong), 422, Problem)
    assert refused.to_dict()["errors"][0]["pointer"] == "/locked", refused
    right = EndRequest.from_dict({"result": {"locked": True}})
    change = ok(complete.sync_detailed(fourth, client=worker, body=right), 200, TaskChange)
    assert change.task.state == TaskState.ACTIVE
    assert change.events[-1].type_ == EventType.TASK_SUBMITTED, change.events
    revise = ReviewRequest.from_dict({"action": "revise", "text": "Check the side gate too"})
    change = ok(review_submission.sync_detailed(fourth, client=fourth_agent, body=revise), 200, TaskChange)
    assert change.events[-1].type_ == EventType.TASK_REVISION_REQUESTED, change.events
    ok(complete.sync_detailed(fourth, client=worker, body=right), 200, TaskChange)
    accept = ReviewRequest.from_dict({"action": "accept"})
    change = ok(review_submission.sync_detailed(fourth, client=fourth_agent, body=accept), 200, TaskChange)
    assert change.task.state == TaskState.COMPLETED
    assert change.task.to_dict()["result"] == {"locked": True}, change.task

    print(f"[drive] OK: {len(STEPS)} steps through the generated client", flush=True)


if __name__ == "__main__":
    main()
