package testenv

import (
	"maps"
	"math"
	"slices"
)

// WaterFill returns the max-min fair allocation of capacity c among demands
// of equal weight, and the level (+Inf when every demand fits).
func WaterFill(demand map[string]int64, c int64) (map[string]float64, float64) {
	ds := slices.Sorted(maps.Values(demand))
	left, n := float64(c), len(ds)
	level := math.Inf(1)
	for i, d := range ds {
		if float64(d)*float64(n-i) > left {
			level = left / float64(n-i)
			break
		}
		left -= float64(d)
	}
	out := make(map[string]float64, len(demand))
	for k, d := range demand {
		out[k] = math.Min(float64(d), level)
	}
	return out, level
}
