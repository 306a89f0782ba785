// Preloaded (node --require) into the console bench's Azurite blob process only: four changes that
// keep a million blobs practical, none changing what any request answers.
//
// 1. Azurite keeps blob metadata in LokiJS collections with binary indices on accountName,
// containerName and snapshot: values every blob of a container shares. LokiJS inserts a new entry
// at the START of its value's equal range, so every Put Blob moves the whole index array (three
// splices at position ~0: O(n) a blob). Here a string value goes at the END of its equal range
// instead: the same sorted order (LokiJS keeps no order within equal values), so every lookup
// answers the same, and the splice moves nothing. Other values keep LokiJS's own insert.
//
// 2. Azurite's blob GC (mark and sweep of unreferenced extents, at start and every 10 minutes)
// lists every blob in pages of 5,000, each page a scan and sort of the whole collection: at
// 570,000 blobs one pass held the process for 6.5 minutes, answering almost nothing. It only
// frees the bodies of overwritten or deleted blobs (in memory here), so it is skipped.
"use strict";

const path = require("path");

const azurite = path.dirname(require.resolve("azurite/package.json", { paths: [process.cwd(), __dirname] }));
const loki = require(require.resolve("lokijs", { paths: [azurite] }));
const original = loki.Collection.prototype.adaptiveBinaryIndexInsert;

loki.Collection.prototype.adaptiveBinaryIndexInsert = function (dataPosition, binaryIndexName) {
  const index = this.binaryIndices[binaryIndexName].values;
  const val = this.data[dataPosition][binaryIndexName];
  if (binaryIndexName.indexOf(".") !== -1 || typeof val !== "string" || index.length === 0) {
    return original.call(this, dataPosition, binaryIndexName);
  }
  const end = this.calculateRangeEnd(binaryIndexName, val, false);
  const at = end >= 0 && end < index.length && this.data[index[end]][binaryIndexName] === val ? end + 1 : end;
  index.splice(Math.max(0, at), 0, dataPosition);
};

const gc = require(path.join(azurite, "dist", "src", "blob", "gc", "BlobGCManager.js"));
gc.default.prototype.markSweep = async function () {};

// 3. A query naming an exact blob `name` among other fields ({accountName, containerName, name}:
// Delete Blob's count and find-and-remove) is answered through its first field's index, and
// accountName's range holds every blob: each delete scanned them all (4 ms a delete at 1,000
// blobs, 110 ms at 30,000; gets and puts stay at 2-3 ms). Here `name` goes first, so the index
// narrows to that blob's versions; the other fields still filter. The same rows match, in any order.
const find = loki.Resultset.prototype.find;
loki.Resultset.prototype.find = function (query, firstOnly) {
  if (query && typeof query === "object" && !Array.isArray(query) && typeof query.name === "string") {
    const keys = Object.keys(query);
    if (keys.length > 1 && keys[0] !== "name") {
      const reordered = { name: query.name };
      for (const key of keys) if (key !== "name") reordered[key] = query[key];
      return find.call(this, reordered, firstOnly);
    }
  }
  return find.call(this, query, firstOnly);
};

// 4. Removing matched documents (Delete Blob's find-and-remove) goes through LokiJS's batch
// removal, which with binary indices flags every index dirty and re-sorts it whole (n log n per
// delete, compared in JavaScript: 70 ms at 30,000 blobs). One document is removed through the
// collection's own single-document path instead, which updates each index in place.
const removeBatchByPositions = loki.Collection.prototype.removeBatchByPositions;
loki.Collection.prototype.removeBatchByPositions = function (positions) {
  if (positions.length === 1) {
    this.remove(this.data[positions[0]]);
    return;
  }
  return removeBatchByPositions.call(this, positions);
};
