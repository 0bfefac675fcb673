import { readFileSync } from "node:fs"
import { Context, Effect, Layer } from "effect"

/** Where the approval page is served; a setup's verification URI is `<publicUrl><APPROVAL_PATH>`. */
export const APPROVAL_PATH = "/setup"
export const APPROVAL_SCRIPT_PATH = "/setup/approve.js"

/**
 * The approval page: static HTML and one small script, no build step and nothing from a CDN. Read once when
 * the layer is built; the script fetches the setup's terms itself, so nothing is templated into the HTML.
 */
export class ApprovalPage extends Context.Service<
  ApprovalPage,
  { readonly html: string; readonly script: string }
>()("router/setup/ApprovalPage") {
  static readonly layer = Layer.effect(
    ApprovalPage,
    Effect.sync(() => {
      const read = (name: string) => readFileSync(new URL(`./page/${name}`, import.meta.url), "utf8")
      return ApprovalPage.of({ html: read("approve.html"), script: read("approve.js") })
    })
  )
}
