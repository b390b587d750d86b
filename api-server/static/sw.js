// The worker app's service worker: shows the push messages the server
// sends (a title, a line and a link into the app) and opens the link when
// the notification is clicked. The payload is data, never markup.
"use strict";

self.addEventListener("push", function (event) {
  var msg = {};
  try { msg = event.data ? event.data.json() : {}; } catch (e) { msg = {}; }
  var title = typeof msg.title === "string" ? msg.title : "meatspace";
  var body = typeof msg.body === "string" ? msg.body : "";
  var url = typeof msg.url === "string" ? msg.url : "/app/tasks";
  // One tag per notification: a message delivered twice is shown once.
  var tag = msg.id !== undefined ? "meatspace-" + String(msg.id) : undefined;
  event.waitUntil(self.registration.showNotification(title, { body: body, tag: tag, data: { url: url } }));
});

self.addEventListener("notificationclick", function (event) {
  event.notification.close();
  var url = event.notification.data && event.notification.data.url;
  // Only links into this app are opened.
  var target = new URL(url || "/app/tasks", self.location.origin);
  if (target.origin !== self.location.origin) target = new URL("/app/tasks", self.location.origin);
  event.waitUntil(self.clients.openWindow(target.href));
});
