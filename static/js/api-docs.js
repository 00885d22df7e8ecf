/* /api/docs: Swagger UI from the vendored bundle (static/vendor/swagger-ui), configured by the
   settings the server renders into #swagger-settings (studio.api.LocalSwagger). */
(function () {
  "use strict";
  var config = JSON.parse(document.getElementById("swagger-settings").textContent);
  var csrf = document.body.dataset.csrfToken;
  config.dom_id = "#swagger-ui";
  config.presets = [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset];
  if (csrf) {
    config.requestInterceptor = function (req) { req.headers["X-CSRFToken"] = csrf; return req; };
  }
  window.ui = SwaggerUIBundle(config);
})();
