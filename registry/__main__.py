from registry.cli import main

main()
