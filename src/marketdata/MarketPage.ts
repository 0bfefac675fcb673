import { readFileSync } from "node:fs"
import { createRequire } from "node:module"
import { dirname, join } from "node:path"
import { Context, Effect, Layer } from "effect"

export const MARKET_PAGE_PATH = "/market"

/**
 * The live market page (docs/decisions.md D130): static HTML, one script of its own and the charting
 * library (`lightweight-charts`, its standalone build from the router's own node_modules: nothing from a
 * CDN). Read once when the layer is built.
 */
export class MarketPage extends Context.Service<
  MarketPage,
  { readonly html: string; readonly script: string; readonly charts: string }
>()("router/marketdata/MarketPage") {
  static readonly layer = Layer.effect(
    MarketPage,
    Effect.sync(() => {
      const read = (name: string) => readFileSync(new URL(`./page/${name}`, import.meta.url), "utf8")
      const library = dirname(createRequire(import.meta.url).resolve("lightweight-charts/package.json"))
      return MarketPage.of({
        html: read("market.html"),
        script: read("market.js"),
        charts: readFileSync(join(library, "dist", "lightweight-charts.standalone.production.js"), "utf8")
      })
    })
  )
}
