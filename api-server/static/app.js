// meatspace worker app: progressive enhancement only. Every action works
// as a plain form without this script; it adds the live feed (long poll
// on the durable cursor) and upload progress. Text goes into the page with
// textContent, never as HTML.
"use strict";

function liveFeed(feed) {
  var task = feed.dataset.task;
  var cursor = parseInt(feed.dataset.cursor, 10) || 0;
  var stateAtLoad = feed.dataset.state;
  var failures = 0;
  function add(item) {
    if (feed.querySelector('[data-id="' + item.id + '"]')) return;
    var li = document.createElement("li");
    li.className = "item " + item.class;
    li.dataset.id = String(item.id);
    var who = document.createElement("span");
    who.className = "who";
    who.textContent = item.who;
    var time = document.createElement("time");
    time.textContent = item.time;
    var p = document.createElement("p");
    p.textContent = item.text;
    li.append(who, " ", time, p);
    feed.appendChild(li);
  }
  function poll() {
    fetch("/app/tasks/" + task + "/feed?after=" + cursor, { credentials: "same-origin", cache: "no-store" })
      .then(function (r) { if (!r.ok) throw new Error(String(r.status)); return r.json(); })
      .then(function (page) {
        failures = 0;
        page.items.forEach(add);
        // The agent asked for changes: the page brings the form back.
        if (page.items.some(function (i) { return i.kind === "task.revision_requested"; })) {
          location.reload();
          return;
        }
        cursor = page.next_cursor;
        feed.dataset.cursor = String(cursor);
        // The task ended elsewhere (cancelled, expired): show the read-only page.
        if (page.terminal && stateAtLoad !== page.task_state) { location.reload(); return; }
        if (!page.terminal) setTimeout(poll, 0);
      })
      .catch(function () {
        failures += 1;
        setTimeout(poll, Math.min(30000, 1000 * failures));
      });
  }
  poll();
}

function uploadProgress(form) {
  var input = form.querySelector('input[type=file]');
  var progress = form.querySelector("progress");
  var error = form.querySelector(".error");
  var max = parseInt(form.dataset.maxBytes, 10);
  form.addEventListener("submit", function (ev) {
    if (!window.FormData || !input.files || input.files.length === 0) return;
    ev.preventDefault();
    error.hidden = true;
    if (input.files[0].size > max) {
      error.textContent = "This photo is too large: photos are limited to " + Math.round(max / 1048576) + " MB.";
      error.hidden = false;
      return;
    }
    var xhr = new XMLHttpRequest();
    xhr.open("POST", form.action);
    xhr.upload.addEventListener("progress", function (e) {
      if (e.lengthComputable) { progress.value = Math.round(100 * e.loaded / e.total); progress.textContent = progress.value + "%"; }
    });
    xhr.addEventListener("load", function () {
      progress.hidden = true;
      if (xhr.status >= 200 && xhr.status < 300) {
        // Sent: the live feed shows it; keep the page (and anything typed).
        form.reset();
        error.textContent = "";
        if (!document.getElementById("feed")) location.assign(xhr.responseURL || location.href);
        return;
      }
      var doc = new DOMParser().parseFromString(xhr.responseText, "text/html");
      var msg = doc.querySelector("#photo-error:not([hidden])") || doc.querySelector(".error");
      error.textContent = msg ? msg.textContent : "The photo could not be sent. Please try again.";
      error.hidden = false;
    });
    xhr.addEventListener("error", function () {
      progress.hidden = true;
      error.textContent = "The photo could not be sent: check your connection and try again.";
      error.hidden = false;
    });
    progress.value = 0;
    progress.hidden = false;
    xhr.send(new FormData(form));
  });
}

// The device's position, for the forms of a task with a place: the
// browser asks the person first; without it (or without this script) the
// forms are sent without a position.
function positionForms(forms) {
  function say(text) {
    forms.forEach(function (form) {
      var status = form.querySelector(".position-status");
      if (status) { status.textContent = text; status.hidden = false; }
    });
  }
  function fill(pos) {
    forms.forEach(function (form) {
      form.elements.latitude.value = String(pos.coords.latitude);
      form.elements.longitude.value = String(pos.coords.longitude);
      form.elements.accuracy_m.value = String(pos.coords.accuracy);
    });
    say("Your position will be sent with it (accurate to " + Math.round(pos.coords.accuracy) + " m).");
  }
  function failed() {
    say("Your position is not available: allow location for this site to send it.");
  }
  navigator.geolocation.watchPosition(fill, failed, { enableHighAccuracy: true, maximumAge: 10000, timeout: 20000 });
}

// A button that asks for the device's position once, saying so in the
// element `statusId`; `found` gets the position, `help` is shown without one.
function positionButton(button, statusId, found, help) {
  var status = document.getElementById(statusId);
  button.hidden = false;
  button.addEventListener("click", function () {
    status.textContent = "Finding your position...";
    status.hidden = false;
    navigator.geolocation.getCurrentPosition(function (pos) {
      found(pos, status);
    }, function () {
      status.textContent = "Your position is not available: " + help;
    }, { enableHighAccuracy: true, timeout: 20000 });
  });
}

// "Use my location" on the open tasks: the list near the device.
function locateButton(button) {
  positionButton(button, "locate-status", function (pos) {
    location.assign("/app/tasks?near=" + pos.coords.latitude.toFixed(5) + "," + pos.coords.longitude.toFixed(5));
  }, "type the place as latitude,longitude instead.");
}

// Settings: "Use my current position" fills the area's point.
function usePosition(button) {
  positionButton(button, "position-status", function (pos, status) {
    document.getElementById("latitude").value = pos.coords.latitude.toFixed(5);
    document.getElementById("longitude").value = pos.coords.longitude.toFixed(5);
    status.textContent = "Filled in your position: save to keep it.";
  }, "type it as latitude and longitude instead.");
}

// Settings: push in this browser, through the service worker, where the
// browser has a push service. The server's VAPID key comes with the page.
function pushSection(section) {
  var status = document.getElementById("push-status");
  var on = document.getElementById("push-on");
  var off = document.getElementById("push-off");
  function say(text) { status.textContent = text; }
  if (!("serviceWorker" in navigator) || !("PushManager" in window)) {
    say("This browser cannot receive push messages: use email instead.");
    return;
  }
  function key() {
    var b64 = section.dataset.key.replace(/-/g, "+").replace(/_/g, "/");
    var raw = atob(b64 + "===".slice((b64.length + 3) % 4));
    var out = new Uint8Array(raw.length);
    for (var i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
    return out;
  }
  function send(path, body) {
    return fetch(path, {
      method: "POST", credentials: "same-origin",
      headers: { "content-type": "application/json", "x-csrf-token": section.dataset.csrf },
      body: JSON.stringify(body)
    }).then(function (res) { if (!res.ok) throw new Error("the server answered " + res.status); });
  }
  function show(subscription) {
    on.hidden = !!subscription;
    off.hidden = !subscription;
    say(subscription ? "This browser gets notifications." : "This browser gets no notifications.");
  }
  navigator.serviceWorker.register("/app/sw.js", { scope: "/app/" }).then(function (reg) {
    section.dataset.worker = "registered";
    return reg.pushManager.getSubscription().then(show).then(function () {
      on.addEventListener("click", function () {
        say("Asking this browser...");
        reg.pushManager.subscribe({ userVisibleOnly: true, applicationServerKey: key() })
          .then(function (sub) { return send("/app/push-subscriptions", sub.toJSON()).then(function () { show(sub); }); })
          .catch(function (e) { say("Notifications could not be turned on here (" + e.message + "): use email instead."); });
      });
      off.addEventListener("click", function () {
        reg.pushManager.getSubscription().then(function (sub) {
          if (!sub) return show(null);
          return send("/app/push-subscriptions/remove", { endpoint: sub.endpoint })
            .then(function () { return sub.unsubscribe(); }).then(function () { show(null); });
        }).catch(function (e) { say("Could not stop notifications here: " + e.message); });
      });
    });
  }).catch(function (e) {
    say("Notifications cannot run in this browser (" + e.message + "): use email instead.");
  });
}

document.addEventListener("DOMContentLoaded", function () {
  if (navigator.geolocation) {
    var forms = Array.prototype.slice.call(document.querySelectorAll("form[data-position]"));
    if (forms.length > 0) positionForms(forms);
    var locate = document.getElementById("locate");
    if (locate) locateButton(locate);
    var here = document.getElementById("use-position");
    if (here) usePosition(here);
  }
  var push = document.getElementById("push");
  if (push) pushSection(push);
  var feed = document.getElementById("feed");
  if (feed && window.fetch) liveFeed(feed);
  var photo = document.getElementById("photo-form");
  if (photo && window.XMLHttpRequest) uploadProgress(photo);
});
