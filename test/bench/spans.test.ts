import { describe, expect, it } from "vitest"
import { type OtlpSpan, phasesOf, spansOf } from "../../bench/load/Spans.ts"

const ns = (ms: number) => String(1_700_000_000_000_000_000n + BigInt(Math.round(ms * 1e6)))

/** An OTLP/HTTP JSON export of `spans`. */
const exportOf = (spans: ReadonlyArray<OtlpSpan>) => ({ resourceSpans: [{ scopeSpans: [{ spans }] }] })

/** One call's export: the server span, its admission, the reservation under it, the upstream call. */
const call = (trace: string, at: number, reserveMs: number) => {
  const span = (
    id: number,
    name: string,
    parent: number | undefined,
    from: number,
    to: number
  ): OtlpSpan => ({
    name,
    traceId: trace,
    spanId: `${trace}${id}`,
    parentSpanId: parent === undefined ? "" : `${trace}${parent}`,
    startTimeUnixNano: ns(at + from),
    endTimeUnixNano: ns(at + to)
  })
  // Listed in the order an exporter sends them, by their ends: the upstream call's `POST` before the server's.
  return exportOf([
    span(3, "postgres", 2, 0.8, 0.8 + reserveMs),
    span(5, "POST", 4, 2, 2.6),
    span(2, "Completions.admit", 1, 0.4, 2.5),
    span(1, "POST", undefined, 0, 3),
    span(4, "Serve.run", 2, 1.9, 9)
  ])
}

describe("bench:phases reads where a call's time goes from its spans", () => {
  it("places each span by its median start and end from its call's server span, named with its parent", () => {
    const spans = [call("a", 0, 1), call("b", 10, 1.2), call("c", 20, 0.8)].flatMap(spansOf)
    // Not calls: a background statement's trace; a provider's quote refresh (a server `POST` with no admission);
    // a call whose server span and `Serve.run` were dropped, so that only its upstream `POST` is left as a root
    // candidate (it still names its parent); and a call that started before the rounds.
    const background = spansOf(
      exportOf([
        { name: "postgres", traceId: "z", spanId: "z1", startTimeUnixNano: ns(5), endTimeUnixNano: ns(6) }
      ])
    )
    const refresh = spansOf(
      exportOf([
        { name: "POST", traceId: "q", spanId: "q1", startTimeUnixNano: ns(7), endTimeUnixNano: ns(8) }
      ])
    )
    const dropped = spansOf(call("d", 30, 5)).filter((span) => span.spanId !== "d1" && span.spanId !== "d4")
    const early = spansOf(call("e", -20, 5))
    const { calls, phases } = phasesOf([...early, ...spans, ...background, ...refresh, ...dropped], {
      sinceNs: BigInt(ns(0))
    })
    expect(calls).toBe(3)
    expect(phases.map((phase) => phase.name)).toEqual([
      "POST",
      "Completions.admit < POST",
      "postgres < Completions.admit",
      "Serve.run < Completions.admit",
      "POST < Serve.run"
    ])
    const reservation = phases.find((phase) => phase.name === "postgres < Completions.admit")!
    expect(reservation.calls).toBe(3)
    expect(reservation.startMs).toBeCloseTo(0.8, 6)
    expect(reservation.lengthMs).toBeCloseTo(1, 6)
    expect(reservation.endMs).toBeCloseTo(1.8, 6)
    expect(phases[0]!.endMs).toBeCloseTo(3, 6)
  })

  it("reads the calls of one kind, by `within` and `without`", () => {
    const keyed = [call("a", 0, 1), call("b", 10, 1.2)].flatMap(spansOf)
    // Later x402 calls: their admission holds the x402 reservation's span.
    const x402 = [call("x", 100, 2), call("y", 110, 3)].flatMap(spansOf).flatMap((span) =>
      span.name === "postgres"
        ? [
            span,
            {
              ...span,
              spanId: `${span.spanId}r`,
              name: "Ledger.reserveX402",
              parentSpanId: span.parentSpanId
            }
          ]
        : [span]
    )
    const all = [...keyed, ...x402]
    const before = phasesOf(all, { sinceNs: BigInt(ns(0)), without: "Ledger.reserveX402" })
    expect(before.calls).toBe(2)
    expect(
      before.phases.find((phase) => phase.name === "postgres < Completions.admit")!.lengthMs
    ).toBeCloseTo(1.1, 6)
    const paid = phasesOf(all, { sinceNs: BigInt(ns(0)), within: "Ledger.reserveX402" })
    expect(paid.calls).toBe(2)
    expect(
      paid.phases.find((phase) => phase.name === "Ledger.reserveX402 < Completions.admit")!.lengthMs
    ).toBeCloseTo(2.5, 6)
    expect(phasesOf(all, { sinceNs: BigInt(ns(100)) }).calls).toBe(2)
  })
})
