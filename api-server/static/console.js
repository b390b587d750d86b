// The console's task page: new events appear in the feed as they happen
// (the task's event stream, /console/tasks/{id}/stream, as Server-Sent
// Events; the browser resumes it after the last event it had). Text is set
// as text, never as markup. Without this script the page shows the feed as
// loaded.
"use strict";

function consoleFeed(list) {
  function add(item) {
    if (document.getElementById("event-" + item.id)) return;
    var li = document.createElement("li");
    li.id = "event-" + item.id;
    var time = document.createElement("time");
    time.dateTime = item.at;
    time.textContent = item.at;
    var kind = document.createElement("strong");
    kind.textContent = item.kind;
    li.appendChild(time);
    li.appendChild(document.createTextNode(" "));
    li.appendChild(kind);
    li.appendChild(document.createTextNode(" (" + item.actor + ")" + (item.text ? ": " : "")));
    if (item.text) {
      var span = document.createElement("span");
      span.className = "event-text";
      span.textContent = item.text;
      li.appendChild(span);
    }
    if (item.photo) {
      var a = document.createElement("a");
      a.href = item.photo;
      a.textContent = "photo";
      li.appendChild(document.createTextNode(" "));
      li.appendChild(a);
    }
    list.appendChild(li);
    localTimes(li);
  }
  if (list.dataset.terminal === "true") return;
  var source = new EventSource("/console/tasks/" + list.dataset.task + "/stream?after=" + list.dataset.cursor);
  source.onmessage = function (message) {
    var item = JSON.parse(message.data);
    add(item);
    // The stream ends after the task's last event: do not reconnect.
    if (item.terminal) source.close();
  };
}

// Copy buttons: each names the element whose text it copies.
function copyButtons() {
  if (!navigator.clipboard) return;
  Array.prototype.forEach.call(document.querySelectorAll("button[data-copy]"), function (b) {
    b.hidden = false;
    b.addEventListener("click", function () {
      var text = document.getElementById(b.dataset.copy).textContent;
      navigator.clipboard.writeText(text).then(function () { b.textContent = "Copied"; });
    });
  });
}

// Times in the viewer's own time zone (the page shows UTC without this
// script); the machine-readable time stays in the datetime attribute.
function localTimes(root) {
  Array.prototype.forEach.call(root.querySelectorAll("time[datetime]"), function (t) {
    var d = new Date(t.dateTime);
    if (!isNaN(d.getTime())) { t.title = t.dateTime; t.textContent = d.toLocaleString(); }
  });
}

document.addEventListener("DOMContentLoaded", function () {
  localTimes(document);
  var list = document.getElementById("console-feed");
  if (list && window.EventSource) consoleFeed(list);
  copyButtons();
});
