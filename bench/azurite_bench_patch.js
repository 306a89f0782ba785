// Preloaded (node --require) into the console bench's Azurite blob process only: two changes that
// keep a million blobs practical, neither changing what any request answers.
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
