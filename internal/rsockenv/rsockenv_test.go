package rsockenv

import (
	"os"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestReadOnce: a change to the environment is seen only after Reload,
// and Setenv's value is gone once its test has ended.
func TestReadOnce(t *testing.T) {
	const name = "RSOCK_RSOCKENV_TEST"
	Reload()
	assert.Equal(t, "", Get(name))
	v := Load()
	t.Run("set", func(t *testing.T) {
		Setenv(t, name, "a")
		assert.Equal(t, "a", Get(name))
		assert.NotSame(t, v, Load(), "a reload is a new reading")
		env := Load().Environ()
		assert.Contains(t, env, name+"=a")
		assert.True(t, slices.IsSorted(env))
		os.Setenv(name, "b") // restored by the subtest's cleanup
		assert.Equal(t, "a", Get(name), "read once")
		Reload()
		assert.Equal(t, "b", Get(name))
	})
	assert.Equal(t, "", Get(name), "the subtest's cleanup restored and reloaded")
	assert.Same(t, Load(), Load())
}
