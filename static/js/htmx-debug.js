/* DEBUG only (see studio_ui.htmx_scripts): when an HTMX request gets a 5xx with an error page
   (Django's technical 500 under DEBUG), show it in place of the document, so a developer sees the
   traceback. A 5xx with an empty body or no HTML page (a proxy's 502, a plain-text answer) has
   nothing to show: it is left to studio.js's banner, as in production, rather than blanking the page.
   4xx answers are left to the htmx-config in base.html: findings (400/402/409/422) swap into their
   target exactly as in production. */
(function () {
  "use strict";
  document.addEventListener("htmx:beforeOnLoad", function (event) {
    var xhr = event.detail.xhr;
    if (!xhr || xhr.status < 500 || !/<html[\s>]/i.test(xhr.responseText || "")) return;
    event.preventDefault();  // htmx stops processing this response
    document.open();
    document.write(xhr.responseText);
    document.close();
  });
})();
