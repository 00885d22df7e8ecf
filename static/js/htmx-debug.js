/* DEBUG only (see studio_ui.htmx_scripts): when an HTMX request gets a 5xx, show the server's
   error page (Django's technical 500 under DEBUG) in place of the document, so a developer sees
   the traceback. 4xx answers are left to the htmx-config in base.html: findings (400/402/409/422)
   swap into their target exactly as in production. */
(function () {
  "use strict";
  document.addEventListener("htmx:beforeOnLoad", function (event) {
    var xhr = event.detail.xhr;
    if (!xhr || xhr.status < 500) return;
    event.preventDefault();  // htmx stops processing this response
    document.open();
    document.write(xhr.responseText);
    document.close();
  });
})();
