"""The dashboard's files (`static/`: HTML, CSS, JavaScript modules), shipped as package data and
served by server/api/ui.py at `/ui/`. No build step and nothing fetched from elsewhere: the
pages call the JSON API and draw their charts as inline SVG (static/charts.js)."""
