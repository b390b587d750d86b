// The console's task page: new events appear in the feed as they happen
// (a long poll of /console/tasks/{id}/feed). Text is set as text, never
// as markup. Without this script the page shows the feed as loaded.
"use strict";

function consoleFeed(list) {
  var task = list.dataset.task;
  var cursor = list.dataset.cursor;
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
  function poll() {
    fetch("/console/tasks/" + task + "/feed?after=" + cursor, { credentials: "same-origin", cache: "no-store" })
      .then(function (res) { if (!res.ok) throw new Error(String(res.status)); return res.json(); })
      .then(function (page) {
        page.items.forEach(add);
        cursor = page.next_cursor;
        if (page.terminal && page.items.length === 0) return;
        poll();
      })
      .catch(function () { setTimeout(poll, 5000); });
  }
  poll();
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
  if (list && window.fetch) consoleFeed(list);
  copyButtons();
});
