//! A 16 KiB stack (the default is 1 MiB), so that the module starts in one
//! 64 KiB page and its cache is what its session's heap reservation holds.
fn main() {
    println!("cargo:rustc-link-arg-cdylib=-zstack-size=16384");
}
