import { assert, describe, it } from "@effect/vitest"
import fc from "fast-check"
import { encodePng, imageSizes, renderPrompt } from "../../src/devnet/fleet/Png.ts"
import { decodePng } from "./support.ts"

describe("the simulated image model's PNG", () => {
  it("round-trips any RGB pixels through a strict reader (property)", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 24 }),
        fc.integer({ min: 1, max: 24 }),
        fc.integer({ min: 0, max: 2 ** 31 }),
        (width, height, seed) => {
          const pixels = Buffer.alloc(width * height * 3)
          for (let i = 0; i < pixels.length; i++) pixels[i] = (seed * (i + 7)) & 0xff
          const decoded = decodePng(encodePng(width, height, pixels))
          assert.strictEqual(decoded.width, width)
          assert.strictEqual(decoded.height, height)
          assert.strictEqual(decoded.bitDepth, 8)
          assert.strictEqual(decoded.colourType, 2)
          assert.isTrue(decoded.pixels.equals(pixels))
        }
      ),
      { numRuns: 200 }
    )
  })

  it("draws a deterministic, prompt-dependent picture at every size", () => {
    for (const [size, side] of Object.entries(imageSizes)) {
      const png = renderPrompt("a lighthouse at dusk", size as keyof typeof imageSizes)
      const decoded = decodePng(png)
      assert.strictEqual(decoded.width, side)
      assert.strictEqual(decoded.height, side)
      assert.isTrue(png.equals(renderPrompt("a lighthouse at dusk", size as keyof typeof imageSizes)))
      // A pattern, not a flat fill: several colours appear.
      const colours = new Set<string>()
      for (let i = 0; i < decoded.pixels.length; i += 3 * 97) {
        colours.add(decoded.pixels.subarray(i, i + 3).toString("hex"))
      }
      assert.isAtLeast(colours.size, 2)
    }
    assert.isFalse(
      renderPrompt("a lighthouse at dusk", "256x256").equals(renderPrompt("a harbor", "256x256"))
    )
    assert.isBelow(renderPrompt("small", "256x256").length, 64 * 1024)
  })

  it("refuses a pixel buffer of the wrong size", () => {
    assert.throws(() => encodePng(2, 2, new Uint8Array(11)))
  })
})
