// The JSON API as the dashboard calls it. The token the user pasted lives in sessionStorage
// (gone when the tab closes) and travels only in the Authorization header, never in a URL.

const KEY = "modelfleet.token";

export const token = {
  get: () => sessionStorage.getItem(KEY),
  set: (value) => sessionStorage.setItem(KEY, value),
  clear: () => sessionStorage.removeItem(KEY),
};

export class ApiError extends Error {
  constructor(status, body) {
    const detail = body && typeof body.detail === "string" ? body.detail : `HTTP ${status}`;
    super(detail);
    this.status = status;
    this.fix = body && typeof body.fix === "string" ? body.fix : "";
  }
}

export async function api(path, { method = "GET", body } = {}) {
  const headers = { Accept: "application/json" };
  const secret = token.get();
  if (secret) headers.Authorization = `Bearer ${secret}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method, headers, cache: "no-store", credentials: "omit", redirect: "error",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = null; }
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}
