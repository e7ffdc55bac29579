package repave

// Helpers of the self-healing rig test (selfheal_rig_test.go): a rig handle per subtest, the host's slots, a
// ValidatingAdmissionPolicy that refuses one node's Machine status writes, and journal counting.

// otherSlot is the slot that is not s.
func otherSlot(s string) string {
	if s == "a" {
		return "b"
	}
	return "a"
}
