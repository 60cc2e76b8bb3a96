#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fnrun_fuzz::cgroup_file(data));
