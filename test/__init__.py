"""The test suite, one package per family (test.attention, test.inference, test.rope, test.kv_cache, test.moe,
test.mc2, test.integrations, test.npu, test.tools, test.ops), test.properties for the property-based tests across
the families and test.common for the float64 references. Modules
import each other as `test.<folder>.<module>`; pytest puts the repository root on sys.path (rootdir import of a
package), child processes get it through PYTHONPATH (test.common.checkout.pythonpath)."""
