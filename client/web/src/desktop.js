// The volunteer page's "desktop client" panel: the two commands that install
// this coordinator's own wheel and start it (GET api/client, issue 36). A
// coordinator that cannot make a wheel (or an older one) answers without them,
// and the panel stays hidden.

/** @param {string} id @param {string} text */
function put(id, text) {
  const el = document.getElementById(id);
  if (el) el.textContent = text;
}

async function showDesktopClient() {
  const panel = document.getElementById("desktop");
  if (!panel) return;
  try {
    const resp = await fetch("api/client", { cache: "no-store" });
    if (!resp.ok) return;
    const info = await resp.json();
    if (!info.available) return;
    put("desktop-install", info.install);
    put("desktop-run", info.run);
    panel.hidden = false;
  } catch {
    // no panel: the page works without it
  }
}

showDesktopClient();
