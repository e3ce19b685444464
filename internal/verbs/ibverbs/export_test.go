//go:build cgo && linux

package ibverbs

import "github.com/rdmanet/rdmanet/internal/verbs"

// FailChannel makes the completion channel that q's events come through
// fail, as a failed read of it does: q and the channel's other CQs fail,
// and new CQs get another channel (tests).
func FailChannel(q verbs.CQ, err error) { q.(*CQ).cc.fail(err) }

// OpenFDs counts the process's open descriptors (tests).
var OpenFDs = openFDs
