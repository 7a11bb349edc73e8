"""`iotune doctor`: every prerequisite, checked, with the fix for each."""
