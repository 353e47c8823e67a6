fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("store") {
        std::process::exit(muster::store::store_main(&args[2..]));
    }
}
