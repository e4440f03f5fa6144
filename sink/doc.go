// Package sink writes joined rows to the target table in batches: bulk
// upserts that skip identical rows and deletes of existing rows only, in one
// target transaction together with the checkpoint row.
package sink
