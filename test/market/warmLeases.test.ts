import { assert, describe, it } from "@effect/vitest"
import fc from "fast-check"
import { type WarmLease, WarmLeases } from "../../src/market/WarmLeases.ts"

/** The bookkeeping of leases kept warm between requests (D555), as pure operations on a clock given. */
const settings = { idleMs: 250, reuseMs: 240_000, perKey: 3 }
const lease = (n: number, capacity = 10, takenAt = 0): WarmLease => ({ leaseId: `l${n}`, capacity, takenAt })

describe("warm capacity leases", () => {
  it("the freshest idle lease is taken first; the oldest idle ones are given back first", () => {
    const warm = new WarmLeases(settings)
    assert.isTrue(warm.put("k", lease(1), 0))
    assert.isTrue(warm.put("k", lease(2), 100))
    assert.isTrue(warm.has("k", 10, 100))
    assert.strictEqual(warm.take("k", 10, 100, () => assert.fail("nothing passed over"))?.leaseId, "l2")
    assert.isTrue(warm.put("k", lease(2), 200))
    // l1 has been idle 250 ms at 250; l2 only 50.
    assert.deepStrictEqual(warm.idle(250), ["l1"])
    assert.deepStrictEqual(warm.idle(449), [])
    assert.deepStrictEqual(warm.idle(450), ["l2"])
    assert.strictEqual(warm.size, 0)
    assert.isFalse(warm.has("k", 10, 450))
  })

  it("a lease taken under a higher ceiling, or too old to carry a request, is passed over and given back", () => {
    const warm = new WarmLeases(settings)
    warm.put("k", lease(1, 10, 0), 10)
    warm.put("k", lease(2, 20, 0), 20)
    warm.put("k", lease(3, 10, 0), 30)
    const dropped: Array<string> = []
    // The ceiling fell to 15: l2's slot may be above it.
    assert.strictEqual(warm.take("k", 15, 40, (id) => dropped.push(id))?.leaseId, "l3")
    assert.strictEqual(warm.take("k", 15, 40, (id) => dropped.push(id))?.leaseId, "l1")
    assert.deepStrictEqual(dropped, ["l2"])
    // `has` agrees with `take`: an unusable freshest lease does not hide a usable older one.
    warm.put("k", lease(6, 10, 0), 41)
    warm.put("k", lease(7, 30, 0), 42)
    assert.isTrue(warm.has("k", 15, 43))
    assert.strictEqual(warm.take("k", 15, 43, (id) => dropped.push(id))?.leaseId, "l6")
    assert.deepStrictEqual(dropped, ["l2", "l7"])
    dropped.splice(1)
    warm.put("k", lease(4, 10, 0), 50)
    assert.isFalse(warm.has("k", 10, 240_000))
    assert.isUndefined(warm.take("k", 10, 240_000, (id) => dropped.push(id)))
    assert.deepStrictEqual(dropped, ["l2", "l4"])
    // Too old already when its request ends: not kept.
    assert.isFalse(warm.put("k", lease(5, 10, 0), 240_000))
  })

  it("after a gap in the heartbeat, leases written before it are handed back and none is kept or reused (D557)", () => {
    const warm = new WarmLeases(settings)
    warm.put("k", lease(1, 10, 0), 10)
    warm.put("k", lease(2, 10, 100), 110)
    warm.put("other", lease(3, 10, 50), 120)
    assert.deepStrictEqual(warm.standSince(0), [])
    // During a gap nothing stands.
    assert.sameMembers(warm.standSince(Number.POSITIVE_INFINITY), ["l1", "l2", "l3"])
    assert.strictEqual(warm.size, 0)
    assert.isFalse(warm.put("k", lease(4, 10, 200), 210))
    assert.deepStrictEqual(warm.standSince(Number.POSITIVE_INFINITY), [])
    // Steady again from 300: a lease written at 250 is not kept, one written at 300 is.
    assert.deepStrictEqual(warm.standSince(300), [])
    assert.isFalse(warm.wouldKeep(lease(5, 10, 250), 320))
    assert.isTrue(warm.put("k", lease(6, 10, 300), 320))
    assert.isTrue(warm.put("k", lease(7, 10, 310), 330))
    assert.deepStrictEqual(warm.standSince(305), ["l6"])
    assert.isTrue(warm.has("k", 10, 340))
    assert.strictEqual(warm.take("k", 10, 340, () => assert.fail("nothing passed over"))?.leaseId, "l7")
  })

  it("keeps at most perKey per (provider, class), none when off, and none once drained", () => {
    const warm = new WarmLeases(settings)
    for (let n = 0; n < 3; n++) assert.isTrue(warm.put("k", lease(n), 0))
    assert.isFalse(warm.put("k", lease(3), 0))
    assert.isTrue(warm.put("other", lease(4), 0))
    assert.isTrue(warm.wouldKeep(lease(5), 1))
    assert.sameMembers(warm.drain(), ["l0", "l1", "l2", "l4"])
    // A request settling after the drain ends its row in its own statement.
    assert.isFalse(warm.wouldKeep(lease(5), 1))
    assert.isFalse(warm.put("k", lease(5), 1))
    assert.strictEqual(warm.size, 0)
    assert.isFalse(new WarmLeases({ ...settings, idleMs: 0 }).put("k", lease(6), 0))
  })

  it("every lease put is either taken, given back idle, or drained, exactly once", () => {
    type Op = { kind: "put" | "take" | "idle" | "gap"; key: number; capacity: number; advance: number }
    const op = fc.record({
      kind: fc.constantFrom<Op["kind"]>("put", "take", "idle", "gap"),
      key: fc.integer({ min: 0, max: 2 }),
      capacity: fc.integer({ min: 1, max: 4 }),
      advance: fc.integer({ min: 0, max: 300 })
    })
    fc.assert(
      fc.property(fc.array(op, { maxLength: 80 }), (ops) => {
        const warm = new WarmLeases({ idleMs: 250, reuseMs: 5_000, perKey: 4 })
        let now = 0
        let next = 0
        const out = new Map<string, number>()
        const inHand: Array<{ key: string; lease: WarmLease }> = []
        const settled = (id: string) => out.set(id, (out.get(id) ?? 0) + 1)
        const kept = new Set<string>()
        // Since when the heartbeat has been steady: a "gap" op ends a gap now (D557).
        let steadySince = 0
        for (const o of ops) {
          now += o.advance
          const key = `k${o.key}`
          if (o.kind === "put") {
            const l = inHand.pop() ?? {
              key,
              lease: { leaseId: `n${next++}`, capacity: o.capacity, takenAt: now }
            }
            if (warm.put(l.key, l.lease, now)) kept.add(l.lease.leaseId)
            else settled(l.lease.leaseId)
          } else if (o.kind === "take") {
            const taken = warm.take(key, o.capacity, now, (id) => {
              kept.delete(id)
              settled(id)
            })
            if (taken !== undefined) {
              assert.isAtMost(taken.capacity, o.capacity)
              assert.isBelow(now - taken.takenAt, 5_000)
              assert.isAtLeast(taken.takenAt, steadySince)
              kept.delete(taken.leaseId)
              inHand.push({ key, lease: taken })
            }
          } else if (o.kind === "gap") {
            steadySince = now
            for (const id of warm.standSince(now)) {
              kept.delete(id)
              settled(id)
            }
          } else {
            for (const id of warm.idle(now)) {
              kept.delete(id)
              settled(id)
            }
          }
          assert.strictEqual(warm.size, kept.size)
        }
        for (const id of warm.drain()) {
          kept.delete(id)
          settled(id)
        }
        for (const l of inHand) settled(l.lease.leaseId)
        assert.strictEqual(kept.size, 0)
        for (const [id, n] of out) assert.strictEqual(n, 1, `${id} given back ${n} times`)
        assert.strictEqual(out.size, next)
      })
    )
  })
})
