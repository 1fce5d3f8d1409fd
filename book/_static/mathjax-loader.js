/* Load MathJax 3 for the book's pages.
 *
 * Prefer a local copy in _static/mathjax/ (the build step in .ci/run, or the
 * one-liner in book/how_to_run.md, unpacks the `mathjax` npm package there; it
 * is never committed), so the rendered book also shows its mathematics
 * offline. Without a local copy, fall back to the CDN that Sphinx uses by
 * default. Sphinx writes `window.MathJax = {...}` (the configuration) before
 * this script runs, so both copies see the same settings.
 */
(function () {
  "use strict";
  var CDN = "https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-mml-chtml.js";
  var me = document.currentScript;
  var local = me ? new URL("mathjax/tex-mml-chtml.js", me.src).href : null;

  function load(src, fallback) {
    var s = document.createElement("script");
    s.id = "MathJax-script";
    s.async = true;
    s.src = src;
    if (fallback) {
      s.onerror = function () {
        s.parentNode.removeChild(s);
        load(fallback, null);
      };
    }
    document.head.appendChild(s);
  }

  if (local) {
    load(local, CDN);
  } else {
    load(CDN, null);
  }
})();
