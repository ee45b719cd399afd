from vocablens.cli import main

main()
